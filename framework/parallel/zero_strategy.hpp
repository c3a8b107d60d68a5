// ZeroStrategy: ParallelStrategy (strategy.hpp) that shards the optimizer
// state between ranks, ZeRO stage 1 ("zero1"), and with stage 2 ("zero2")
// the gradients as well.
//
// Layout (flat_shards.hpp)
// - The parameters that require grad (one floating dtype, dense), in
//   registration order, share one flat index space split into equal
//   shards, one per rank. The part of a parameter inside this rank's shard
//   is a piece: a 1-D view of the rank's flat parameter shard.
//
// Each step, zero1
// - backward() accumulates into param.grad(), which are views into one
//   flat gradient buffer (backward writes it in place; no copy out).
// - step(): a reduce-scatter (Avg) of the flat gradient leaves this rank
//   the average gradient of its shard; the optimizer, whose param groups
//   now hold this rank's pieces (views of its slice of the model's flat
//   parameters), steps them in place; an allgather in place fills in the
//   other ranks' slices, so every rank's model is whole again; the gradient
//   buffer is zeroed; rank 0's buffers (batch norm statistics) are
//   broadcast, as DDP does after its gradient sync.
//
// Each step, zero2
// - The flat space is cut into buckets (DdpOptions::bucketCapBytes), laid
//   out from the last registered parameter to the first, the order in
//   which backward produces gradients; a rank owns a slice of every bucket.
// - As backward hands over a parameter's gradient (GradReadyHooks), it goes
//   to its bucket and param.grad() is dropped; a complete bucket is
//   reduce-scattered (Avg) at once, in bucket order on every rank, at most
//   two buckets in flight (shard_grad_reducer.hpp). After backward,
//   unfinished buckets go too (missing gradients as zeros), and each
//   bucket's average lands in this rank's gradient shard, which is all the
//   gradient memory kept between steps (1/world of DDP's).
// - Every backward reduces, micro-batches of gradient accumulation
//   included (their shard sums them, as DDP's buckets do).
// - step(): the optimizer steps the pieces, bucket allgathers in place.
//
// Both
// - So every rank ends a step with the same parameters as DDP with the same
//   optimizer would give, for an optimizer whose update of an element
//   depends only on that element's gradient and state (SGD, momentum, Adam,
//   AdamW, ...). One that uses a whole tensor's norm (LAMB, LARS) would see
//   pieces instead; that is not detected.
// - Parameters that got no gradient count as zero gradients (DDP with
//   find_unused_parameters).
//
// Optimizer and state (sharded_optimizer.hpp, shared with fsdp)
// - optimizer() is the optimizer it was given, whose param groups (same
//   options, learning rates set by the trainer) hold this rank's pieces;
//   its state exists for them only: about 1/world of DDP's.
// - The consolidated state of a checkpoint being resumed (loaded into the
//   optimizer before the strategy is built) is cut into pieces at
//   construction, whatever the optimizer (optimizer_state.hpp).
// - saveState(): collective. The pieces' state is allgathered key by key
//   (so each rank holds one full copy of one state tensor kind at a time),
//   and rank 0 writes the same archive as a single process would.
//
// What user code sees of gradients: zero1's param.grad() holds this rank's
// own (not averaged) gradient until step(); zero2's is always empty (it is
// handed to the buckets as it arrives). So gradient clipping or norms on
// param.grad() do not apply under either; that is not detected.
//
// Errors (UsageError, before training): parameters of two dtypes, a sparse
// embedding, or models that differ between ranks (model_sync.hpp). At
// step(): a sparse gradient, or a parameter moved off the flat buffer (a
// model.load() or module->to() after construction).
#pragma once

#include <memory>

#include "framework/parallel/flat_shards.hpp"
#include "framework/parallel/strategy.hpp"

namespace ddp {

class ZeroStrategy : public ParallelStrategy {
 public:
  // stage 1 (zero1) or 2 (zero2).
  explicit ZeroStrategy(StrategyContext context, int stage = 1);
  ~ZeroStrategy() override;

  const char* name() const override;
  torch::nn::Module& model() override;
  torch::optim::Optimizer& optimizer() override;
  void backward(const at::Tensor& loss, bool lastMicroBatch) override;
  void step() override;  // clips (setGradientClipping) before the optimizer steps
  bool supportsGradientClipping() const override { return true; }
  void saveState(torch::serialize::OutputArchive* archive) override;
  // The model whole on every rank (each writes 1/world of it), the
  // optimizer's state as this rank's pieces.
  HeldState heldState() override;
  // Parameters: the flat buffer the model's parameters view (this rank's
  // shard is its slice); gradients: zero1 the flat buffer and the shard's
  // average (1 + 1/world of DDP's), zero2 the shard only (1/world).
  HeldBytes heldBytes() override;

  const FlatShards& shards() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp
