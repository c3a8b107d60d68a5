// ParallelStrategy: how a rank's model takes part in data-parallel
// training. The trainer hands a strategy the model and the optimizer; the
// strategy wraps the model, owns gradient synchronisation and optimizer
// stepping (gradient accumulation over no-sync micro-batches, zeroing
// gradients), and saves and loads the training state.
//
// Contract
// - Each micro-batch: the trainer runs forward on model() and calls
//   backward(loss, lastMicroBatch). Only the last micro-batch of an
//   optimizer step synchronises; the others accumulate locally. Then
//   step() (once per optimizer step, after the last micro-batch's backward)
//   leaves every rank with the same, updated parameters and gradients
//   ready for the next step's accumulation (zeroed, or dropped where that
//   is equivalent).
// - Every rank calls backward(), step() and saveState() at the
//   same points with the same arguments (they may run collectives).
// - optimizer() is the one whose param_groups' learning rates the trainer
//   sets per epoch. A sharded strategy (ZeRO, FSDP) may keep its own
//   optimizer over its shard: it then owns step() completely and returns
//   the optimizer whose param_groups mirror the full one's.
// - saveState(archive): writes "model" and "optimizer" sub-archives that
//   are consolidated (the same as a single process's module.save() and
//   optimizer.save()), so any strategy and any world size can load them.
//   archive is non-null on the rank that writes the checkpoint (rank 0)
//   and null elsewhere; a sharded strategy gathers to that rank.
// - Resuming: the trainer loads a checkpoint's consolidated state
//   (loadModelAndOptimizer) into the model and optimizer before it creates
//   the strategy, so a strategy wraps or shards what it is given and needs
//   no load of its own (DDP's gradient hooks do not survive a load into
//   parameters they are already attached to).
// - The model passed in must stay alive as long as the strategy; the
//   strategy owns the optimizer.
//
// StrategyRegistry: strategies by name, chosen by the experiment key
// distributed.strategy. create() with an unknown name throws UsageError
// listing the known ones. builtinStrategies() holds "ddp" (DDP at world size
// > 1, LocalStrategy on one rank), "zero1" and "zero2" (ZeroStrategy:
// optimizer state sharded; zero2 the gradients too) and "fsdp"
// (FsdpStrategy: parameters sharded as well, gathered unit by unit).
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "framework/comm/process_group.hpp"
#include "framework/parallel/ddp.hpp"
#include "framework/parallel/held_state.hpp"

namespace ddp {

class ParallelStrategy {
 public:
  virtual ~ParallelStrategy() = default;

  virtual const char* name() const = 0;
  virtual torch::nn::Module& model() = 0;
  virtual torch::optim::Optimizer& optimizer() = 0;

  // loss.backward() of one micro-batch; synchronises when lastMicroBatch.
  virtual void backward(const at::Tensor& loss, bool lastMicroBatch) = 0;
  // The optimizer step after the last micro-batch's backward.
  virtual void step() = 0;

  virtual void saveState(torch::serialize::OutputArchive* archive) = 0;

  // Sharded checkpoints (held_state.hpp): what this rank holds of the
  // model and the optimizer, and where each piece lies in the whole
  // tensors. Not collective. The default is everything whole, as one rank
  // holds it; a strategy whose ranks hold copies (ddp) or shards must
  // override it, or a sharded save finds ranges written twice and fails.
  virtual HeldState heldState();
  // After loadHeldState() has written into what heldState() listed: makes
  // whatever the strategy derives from it consistent again (fsdp gathers
  // its root). Collective: every rank calls it.
  virtual void afterStateLoaded() {}

  // Elastic recovery (launch/elastic.hpp): hands the optimizer back,
  // whole, without a collective (the group may be broken), after which the
  // strategy is destroyed and another built on the same model and a new
  // group. Strategies whose optimizer holds the whole state on every rank
  // (ddp, and one rank) can; the default is a UsageError naming the
  // strategy.
  virtual std::unique_ptr<torch::optim::Optimizer> releaseOptimizer();

  // Runs fn while every parameter of model() is whole, for code that reads
  // them outside forward and backward (the trainer's final parameters,
  // tests). Collective: every rank calls it. fsdp gathers its units for the
  // call; every other strategy keeps parameters whole, and just calls fn.
  virtual void withFullParameters(const std::function<void()>& fn) { fn(); }

  // Whether model()'s forward runs collectives (fsdp's gathers), so that
  // every rank must run the same number of forwards, evaluation included.
  virtual bool collectiveForward() const { return false; }
  // Uneven inputs (training.join): in an optimizer step that some ranks
  // have no batch for, every rank first calls setContributors(k) with the
  // number of ranks that have one; those run backward() as usual, the
  // others shadowBackward() instead, and all call step(). Gradients are
  // then averaged over the k contributing ranks, and every rank applies
  // them. A strategy that cannot shadow (supportsJoin() false) has its
  // shards padded by the trainer instead.
  virtual bool supportsJoin() const { return false; }
  // How long the last step() waited for gradient communication that
  // backward did not hide, or nullopt where the strategy does not measure
  // it (for steps.jsonl and the straggler report).
  virtual std::optional<double> lastGradientWaitSeconds() const { return std::nullopt; }
  virtual void setContributors(int /*contributors*/) {}
  virtual void shadowBackward();

  // What this rank holds between steps, in bytes, summed over the tensors
  // it keeps (a storage shared by several tensors counted once): for the
  // metrics and the benchmarks. The default counts the model's parameters,
  // their gradients and the optimizer's state; a strategy with buffers of
  // its own (buckets, shards) adds them.
  struct HeldBytes {
    int64_t parameters = 0, gradients = 0, optimizerState = 0;
  };
  virtual HeldBytes heldBytes() { return countHeldBytes({}, {}); }

  // Gradient clipping (training.clip_grad_norm; 0: off). With it, every
  // step() computes the global L2 norm of the gradients its optimizer is
  // about to step on, all of them over all ranks (a sharded strategy adds
  // its ranks' sums of squares with one allreduce of one number, so zero2
  // and fsdp give the norm of the whole averaged gradient too), remembers
  // it, and scales the gradients by maxNorm / (norm + 1e-6) where that is
  // below 1, as torch.nn.utils.clip_grad_norm_ does. Every rank calls it
  // with the same value.
  // A strategy whose step() does not call clipGradients (one from a plugin
  // that does not declare supportsGradientClipping()) refuses a norm > 0
  // with a UsageError, rather than training unclipped.
  void setGradientClipping(double maxNorm);
  virtual bool supportsGradientClipping() const { return false; }
  // The norm before clipping of the last step(); nullopt without clipping.
  std::optional<double> lastGradNorm() const { return lastGradNorm_; }

 protected:
  // Called by step() of each strategy after its gradients are reduced and
  // before the optimizer steps: clips optimizer()'s gradients as above.
  // `shardGroup`: null where every rank holds the whole averaged gradient
  // (ddp, one rank), else the group whose ranks hold disjoint shards of it.
  void clipGradients(ProcessGroup* shardGroup, Milliseconds timeout = kUseGroupTimeout);

  // The default count plus a strategy's own parameter and gradient tensors.
  HeldBytes countHeldBytes(std::vector<at::Tensor> extraParameters, std::vector<at::Tensor> extraGradients);

 private:
  double clipNorm_ = 0;
  std::optional<double> lastGradNorm_;
};

// Bytes of the storages behind `tensors`, each counted once (undefined
// tensors skipped).
int64_t storageBytes(const std::vector<at::Tensor>& tensors);

// What a strategy is built from.
struct StrategyContext {
  std::shared_ptr<torch::nn::Module> model;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  ProcessGroupPtr group;
  // hsdp only: the ranks that hold the same shard as this one (a column of
  // the rank mesh, framework/comm/sub_groups.hpp); `group` is then this
  // rank's row, the ranks it shards with.
  ProcessGroupPtr replicateGroup;
  DdpOptions ddp;  // bucket sizes, unused parameters, timeout
  struct FsdpOptions {
    // Gather unit i - 1 while unit i runs backward: overlaps the gather
    // with compute, holds one unit more (PyTorch's BACKWARD_PRE).
    bool backwardPrefetch = true;
    // Consecutive units joined until each group holds this many bytes of
    // parameters (0: each unit alone).
    int64_t unitBytes = 0;
  } fsdp;
};

// A factory takes from the context what it keeps. One that throws leaves
// in it what it had not taken yet: the ddp strategy takes the optimizer
// only once its DistributedDataParallel is built (which allocates the
// gradient buckets, collectively), so that an elastic recovery that loses
// a rank just then keeps its optimizer for the next attempt.
using StrategyFactory = std::function<std::unique_ptr<ParallelStrategy>(StrategyContext&& context)>;

class StrategyRegistry {
 public:
  // A name registered twice is a UsageError.
  void add(const std::string& name, StrategyFactory factory);
  bool has(const std::string& name) const { return factories_.count(name) > 0; }
  std::vector<std::string> names() const;
  std::unique_ptr<ParallelStrategy> create(const std::string& name, StrategyContext&& context) const;

 private:
  std::map<std::string, StrategyFactory> factories_;
};

// The registry the trainer and the experiment config use, holding the
// built-in strategies; add more to it before loading an experiment.
StrategyRegistry& builtinStrategies();

// Saves or loads "model" and "optimizer" of a module and its optimizer as
// one process holds them (the format of every checkpoint). Load before the
// strategy is created. With `copies` the archive holds copies of the
// model's parameters and buffers (in Module::save's layout) instead of the
// tensors themselves: the copy in `copies` (by TensorImpl) where there is
// one, else a fresh clone.
using TensorCopies = std::unordered_map<const void*, at::Tensor>;
void saveModelAndOptimizer(torch::serialize::OutputArchive& archive, torch::nn::Module& model,
                           torch::optim::Optimizer& optimizer, const TensorCopies* copies = nullptr);
void loadModelAndOptimizer(torch::serialize::InputArchive& archive, torch::nn::Module& model,
                           torch::optim::Optimizer& optimizer);

}  // namespace ddp
