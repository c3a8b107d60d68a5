// DistributedDataParallel: data-parallel training of any torch::nn::Module
// over a ProcessGroup.
//
// Contract
// - Every rank builds the same model (same parameter and buffer names,
//   shapes, dtypes and requires_grad, in the same registration order) and
//   wraps it with the same DdpOptions. The constructor checks this with a
//   collective and throws UsageError on every rank naming the first tensor
//   that differs; then it copies rank 0's parameters and buffers to all
//   ranks, so ranks may start from different random initialisations.
// - Each training step: forward on the wrapped module (call it directly;
//   DDP does not wrap forward), loss.backward(), then
//   finishGradientSync(), then optimizer.step(). After finishGradientSync()
//   every rank's param.grad() holds the average over ranks of the local
//   gradients, and (broadcastBuffers) every rank holds rank 0's buffers.
//   Between backward and finishGradientSync() param.grad() is in flux: with
//   gradientAsBucketView it is the bucket itself, which may be being
//   averaged in place already. To see a rank's own gradient, take it with
//   torch::autograd::grad() (which fires no DDP hook) or under noSync().
// - Gradients are averaged in buckets of parameters, in reverse
//   registration order (an approximation of the order in which backward
//   produces them). With overlap, a bucket's allreduce starts during
//   backward as soon as its gradients and those of every earlier bucket
//   are ready; buckets always start in index order, so every rank issues
//   the same sequence of collectives whatever order its hooks fire in.
// - Each bucket is reduced by a CommHook (framework/parallel/comm_hook.hpp),
//   by default an allreduce with Avg; another is set through
//   DdpOptions::commHook or registerCommHook() before the first backward.
// - At construction the bucket layout (buckets, parameters, bytes) is
//   logged at DDP_LOG_LEVEL=info.
// - Every rank must run the same number of synced steps; a rank that skips
//   one leaves its peers waiting until the collective timeout.
// - Parameters that require grad but received no gradient since the last
//   sync: by default finishGradientSync() still completes the collectives
//   (so peers are not left waiting) and then throws UsageError naming them.
//   With findUnusedParameters they count as zero gradients, and every rank
//   ends with a defined param.grad() equal to the average (zero when no
//   rank used the parameter), so optimizers treat them alike everywhere.
// - Gradient accumulation: backward passes run while a noSync() guard is
//   alive accumulate into param.grad() locally and communicate nothing.
//   The next synced backward (or a finishGradientSync() after only noSync
//   passes) averages the accumulated gradients.
// - Misuse is detected with UsageError: a second backward pass before
//   finishGradientSync() of a synced one, finishGradientSync() with no
//   backward pass since the last one, or inside noSync(). Sparse gradients
//   are not supported.
// - Not thread-safe across calls: one training loop drives one instance.
//   Backward hooks may fire on autograd's threads; that is handled.
// - The module must outlive this object. The destructor removes its hooks.
#pragma once

#include <torch/nn/module.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "framework/comm/process_group.hpp"
#include "framework/parallel/comm_hook.hpp"
#include "framework/parallel/model_sync.hpp"

namespace torch::autograd {
struct Node;
}

namespace ddp {

struct DdpOptions {
  size_t bucketCapBytes = 25 * 1024 * 1024;
  // Small, so the first allreduce starts early in backward.
  size_t firstBucketCapBytes = 1024 * 1024;
  bool findUnusedParameters = false;
  // false: every allreduce starts in finishGradientSync() (for comparing
  // overlap on and off).
  bool overlap = true;
  bool broadcastBuffers = true;
  // After a sync, param.grad() shares memory with its slice of the bucket,
  // so the next backward accumulates straight into the bucket and neither
  // the copy in nor the copy out happens (two passes over all gradients
  // per step). Optimizers that zero gradients in place keep the sharing;
  // one that replaces a gradient tensor just gets copied, as without it.
  bool gradientAsBucketView = true;
  Milliseconds timeout = kUseGroupTimeout;
  // Reduces each bucket; null: AllreduceAvgHook(timeout).
  CommHookPtr commHook;
  // The caller made every rank's parameters and buffers equal already (an
  // elastic recovery's state broadcast): the constructor skips its check
  // that the models match and its broadcast from rank 0, so it runs no
  // collective (a rank lost then would fail outside the recovery's retry).
  bool statesEqual = false;
};

class DistributedDataParallel {
 public:
  using Clock = std::chrono::steady_clock;

  struct BucketInfo {
    std::vector<std::string> parameterNames;  // in bucket order (reverse registration)
    size_t numel = 0;
    size_t bytes = 0;
    std::string dtype;
  };

  // Timestamps of the last synced step, for tests and benchmarks.
  struct SyncTimeline {
    Clock::time_point backwardStart;  // first gradient hook of the synced backward
    Clock::time_point backwardEnd;    // last gradient hook of the synced backward
    Clock::time_point finishStart;    // finishGradientSync() entered
    Clock::time_point finishEnd;      // finishGradientSync() done
    std::vector<Clock::time_point> bucketLaunch;  // allreduce started, per bucket index
    std::vector<bool> launchedDuringBackward;     // per bucket index
    // Time spent inside the comm hook's calls: a small collective runs
    // there in the caller (the gloo backend's inline path), waiting for
    // the peers during backward.
    double hookSeconds = 0;
    // The buffer broadcast that ends finishGradientSync() (broadcastBuffers).
    double buffersSeconds = 0;
  };

  // RAII: while alive, backward passes accumulate locally (see the contract).
  class [[nodiscard]] NoSyncGuard {
   public:
    explicit NoSyncGuard(DistributedDataParallel* owner);
    ~NoSyncGuard();
    NoSyncGuard(NoSyncGuard&& other) noexcept;
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(NoSyncGuard&&) = delete;

   private:
    DistributedDataParallel* owner_;
  };

  DistributedDataParallel(std::shared_ptr<torch::nn::Module> module, ProcessGroupPtr group, DdpOptions options = {});
  ~DistributedDataParallel();

  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // Call after backward, before optimizer.step(). See the contract.
  void finishGradientSync();

  NoSyncGuard noSync() { return NoSyncGuard(this); }

  // Uneven inputs (as PyTorch's Join): a rank that has no batch for a step
  // its peers take calls shadowBackward() instead of backward: it issues
  // the step's bucket collectives with zero gradients, so nobody waits.
  // Then finishGradientSync() as usual.
  void shadowBackward();
  // How many ranks had a batch in the next synced step (default: all): the
  // averaged gradients are rescaled from the mean over all ranks to the
  // mean over those, so that shadowing ranks' zeros do not count. Every
  // rank sets the same number; it holds for one step.
  void setContributors(int contributors);

  // Replaces the bucket reduction (see comm_hook.hpp). Only before the
  // first backward pass; later it is a UsageError.
  void registerCommHook(CommHookPtr hook);

  // Copies rank 0's buffers to every rank; finishGradientSync() does it
  // when options.broadcastBuffers is set. The buffers are the module's at
  // construction (as PyTorch's DDP keeps them): update them in place.
  void syncBuffers();

  const std::shared_ptr<torch::nn::Module>& module() const { return module_; }
  template <typename ModuleT>
  std::shared_ptr<ModuleT> moduleAs() const {
    return std::dynamic_pointer_cast<ModuleT>(module_);
  }
  ProcessGroup& group() const { return *group_; }
  const DdpOptions& options() const { return options_; }

  size_t bucketCount() const { return buckets_.size(); }
  std::vector<BucketInfo> bucketInfo() const;
  SyncTimeline lastSyncTimeline() const;
  // Of the last finished step: the wait in finishGradientSync() plus the
  // time inside the comm hook's calls (SyncTimeline::hookSeconds); no copy
  // of the timeline, for a per-step caller.
  double lastSyncWaitSeconds() const;

 private:
  struct Bucket {
    std::vector<size_t> params;  // indices into params_
    std::vector<int64_t> offsets;
    std::vector<at::Tensor> tensors;  // the parameters, for the comm hook
    at::Tensor buffer;  // flat, one dtype and device
    size_t pending = 0;  // params whose gradient has not arrived this step
    bool launched = false;
    WorkPtr work;
  };

  struct Param {
    std::string name;
    at::Tensor tensor;
    size_t bucket = 0;
    size_t slot = 0;  // position within the bucket
    std::shared_ptr<torch::autograd::Node> accumulator;  // kept alive, else autograd drops it and our hook
    uintptr_t hookKey = 0;
  };

  class GradHook;
  friend class GradHook;
  friend class NoSyncGuard;

  void verifyModelsMatch();
  void broadcastFromRankZero(const std::vector<at::Tensor>& tensors);
  void buildBuckets();
  void logBucketLayout() const;
  void installHooks();

  // Called by GradHook on autograd's thread once params_[index].grad() is final.
  void onGradientReady(size_t index);
  void onBackwardEnd();
  void copyGradIntoBucket(size_t index);  // zeros when the gradient is undefined
  // `grad` is exactly slot `slot` of the bucket (its memory, contiguous).
  static bool isBucketSlice(const at::Tensor& grad, const Bucket& bucket, size_t slot);
  void markReadyLocked(size_t index);
  void launchReadyBucketsLocked(bool inBackward);
  void launchBucketLocked(size_t b, bool inBackward);
  void resetStepLocked();

  std::shared_ptr<torch::nn::Module> module_;
  ProcessGroupPtr group_;
  DdpOptions options_;

  std::vector<Param> params_;  // those that require grad, in registration order
  std::vector<Bucket> buckets_;
  CommHookPtr commHook_;
  std::unique_ptr<PackedBroadcast> buffers_;  // the module's buffers, for syncBuffers()
  int contributors_ = 0;  // of the current step; the world size unless setContributors()

  // Step state, guarded by mutex_ (hooks may run on autograd's threads).
  mutable std::mutex mutex_;
  int noSyncDepth_ = 0;
  bool anyBackward_ = false;        // a backward pass has reached a hook
  bool inBackward_ = false;         // between a pass's first hook and its end callback
  bool currentPassSynced_ = false;  // the pass in progress started outside noSync()
  int syncedPasses_ = 0;            // synced backward passes since the last finish
  int localPasses_ = 0;             // noSync passes since the last finish
  std::vector<bool> readyThisStep_;  // gradient copied into its bucket
  std::vector<bool> usedSinceSync_;  // hook fired in any pass since the last finish
  size_t nextToLaunch_ = 0;
  SyncTimeline timeline_;      // being filled
  SyncTimeline lastTimeline_;  // of the last finished step
  double lastWaitSeconds_ = 0;  // lastSyncWaitSeconds()
};

using DDP = DistributedDataParallel;

// The average over the ranks of `value`, for logging loss and accuracy.
double averageAcrossRanks(ProcessGroup& group, double value);
std::vector<double> averageAcrossRanks(ProcessGroup& group, const std::vector<double>& values);

}  // namespace ddp
