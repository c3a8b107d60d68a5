// FsdpStrategy: ParallelStrategy (strategy.hpp) that shards parameters,
// gradients and optimizer state between ranks ("fsdp", fully sharded data
// parallel, ZeRO stage 3).
//
// Units
// - The model's units (sharding_units.hpp; a GPT's blocks, an MLP's
//   layers) are what is gathered and freed. Parameters outside every unit
//   (embeddings, final norm, a tied head; everything, for a model that
//   names no units) form the root, which stays whole, as under zero2.
// - Layout (flat_shards.hpp): the trainable parameters are laid out from
//   the last unit to the first, then the root, each unit's in reverse
//   registration order (the order backward produces them); buckets never
//   span two units, and are cut at DdpOptions::bucketCapBytes within one.
//   A rank owns a slice of every bucket: its shard, kept between steps, is
//   all it holds of a unit.
// - StrategyContext::fsdp.unitBytes (distributed.fsdp_unit_mb) joins
//   consecutive units into groups of at least that many bytes, gathered
//   and released as one (fewer, larger collectives for small units); 0
//   keeps each unit alone. Below, "unit" means such a group.
//
// Each step
// - Forward, unit i (runUnit): its full parameters are allgathered from the
//   shards into one buffer, of which the parameters are views (waiting for
//   the prefetch if one was started), the allgather of unit i + 1 is
//   started, the unit runs, and the buffer's memory is released (the
//   parameters keep their shapes; autograd's saved tensors keep the
//   storage, now empty). An autograd hook on the unit's output gathers the
//   unit again when backward reaches it, and (StrategyContext::fsdp.
//   backwardPrefetch, distributed.fsdp_backward_prefetch) starts the gather
//   of unit i - 1.
// - Backward: gradients go to their buckets as they arrive and complete
//   buckets are reduce-scattered (shard_grad_reducer.hpp), each waited for
//   at once, so only the running unit's gradients are held; when all of a
//   unit's gradients have arrived, its buffer is released again. After
//   backward every unit is released, and this rank's gradient shard holds
//   the average (summed over micro-batches).
// - step(): the optimizer steps this rank's pieces (sharded_optimizer.hpp),
//   the root is allgathered back whole, rank 0's buffers (batch norm
//   statistics) are broadcast.
// - So every rank ends a step with DDP's parameters (up to float rounding),
//   for the optimizers ZeroStrategy serves (zero_strategy.hpp).
//
// Memory held between steps: the root whole, this rank's shard of
// everything, its gradient shard, its optimizer state: about 1/world of
// DDP's plus the root. During a step, besides: two units (the one running
// and the prefetched one) in forward; in backward the running unit, the
// prefetched one (without backward prefetch, none) and the running unit's
// full gradients.
//
// What user code sees
// - Between steps a unit's parameters have no memory: read them inside
//   withFullParameters() (collective), which gathers every unit for the
//   call. saveState() does so too, and writes the consolidated checkpoint.
//   Once the strategy is gone the units' parameters stay empty: take what
//   is needed (a checkpoint, copies) before.
// - param.grad() is always empty (gradients live in the shard); clipping or
//   norms on it do not apply.
// - A unit that runs twice in one forward is gathered twice.
//
// Hybrid sharding ("hsdp", StrategyContext::replicateGroup set): the above
// within `group`, a row of the rank mesh (framework/comm/sub_groups.hpp;
// the ranks of one host by default), so gathers and reduce-scatters stay
// inside it. Each rank's gradient shard, averaged over its row, is then
// averaged over its column (the ranks of the other rows that hold the same
// shard) with one allreduce of the shard, before clipping and the
// optimizer step: every rank ends a step with DDP's parameters over the
// whole world, holding 1/row of them. Rank 0's parameters and buffers
// reach every rank down the columns, then along the rows.
//
// Errors (UsageError, before training): as ZeroStrategy's (two dtypes, a
// sparse embedding, models that differ between ranks).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "framework/parallel/strategy.hpp"

namespace ddp {

// Per trainable parameter of `model`, in registration order (the order of
// shardableParameters, model_sync.hpp): the group of units fsdp gathers it
// with, or -1 for the root. Consecutive units are joined into one group
// until it holds at least unitBytes of parameters (0: each unit alone). A
// model that is not ShardingUnits has only the root.
std::vector<int> fsdpUnitOf(torch::nn::Module& model, int64_t unitBytes = 0);

class FsdpStrategy : public ParallelStrategy {
 public:
  explicit FsdpStrategy(StrategyContext context);
  ~FsdpStrategy() override;

  const char* name() const override;  // "hsdp" with a replicate group
  torch::nn::Module& model() override;
  torch::optim::Optimizer& optimizer() override;
  void backward(const at::Tensor& loss, bool lastMicroBatch) override;
  void step() override;  // clips (setGradientClipping) before the optimizer steps
  bool supportsGradientClipping() const override { return true; }
  void saveState(torch::serialize::OutputArchive* archive) override;
  // This rank's pieces of the trainable parameters and of their optimizer
  // state (under hsdp held by its column: each of them writes a part);
  // frozen parameters and buffers whole. afterStateLoaded() gathers the
  // root from the loaded pieces.
  HeldState heldState() override;
  void afterStateLoaded() override;
  void withFullParameters(const std::function<void()>& fn) override;
  bool collectiveForward() const override;
  HeldBytes heldBytes() override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp
