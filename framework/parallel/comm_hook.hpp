// CommHook: how DistributedDataParallel reduces one gradient bucket, as
// PyTorch's register_comm_hook.
//
// Contract
// - DDP calls the hook once per bucket per synced step, in bucket index
//   order on every rank (so every rank issues the same collectives), as soon
//   as the bucket's gradients are ready: during backward with overlap, else
//   in finishGradientSync(). At world size 1 no hook runs: the average over
//   one rank is the gradient itself.
// - The hook gets the bucket's index, its flat buffer (one dtype and device;
//   the rank's local gradients, summed over noSync micro-batches) and the
//   parameters whose gradients it holds (in bucket order), and returns a
//   Work. When that Work has completed successfully, the buffer must hold
//   the average over the ranks of their buffers (or whatever the hook
//   decides the gradient is: compression, scaling). DDP waits for every
//   bucket's Work in finishGradientSync() and then hands the buffer to the
//   parameters' grad().
// - A hook that post-processes a collective's result (e.g. allreduce Sum,
//   then divide) returns a Work that completes after that step; see
//   thenWork() below. A failed Work makes finishGradientSync() throw.
// - The hook may run on autograd's threads; DDP serialises calls to it.
//   It must not block on its own Work.
// - Set through DdpOptions::commHook or registerCommHook() before the first
//   backward pass; afterwards it is a UsageError.
// - A hook object serves one DDP instance: it may keep state per bucket
//   index (PowerSGD's error feedback), and each DDP gets its own from the
//   plugin registry (distributed.comm_hook; plugins/comm_hooks.cpp holds
//   the built-in ones: allreduce, fp16, bf16, powersgd).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <vector>

#include "framework/comm/process_group.hpp"

namespace ddp {

struct GradBucket {
  size_t index = 0;
  at::Tensor& buffer;                        // flat, this rank's gradients in, the result out
  const std::vector<at::Tensor>& parameters;  // the parameters in the buffer, in order

  // The buffer's slice of each parameter, in its shape: the parameters lie
  // one after the other, with no padding.
  std::vector<at::Tensor> gradients() const;
};

class CommHook {
 public:
  virtual ~CommHook() = default;
  virtual WorkPtr run(ProcessGroup& group, GradBucket& bucket) = 0;
};

using CommHookPtr = std::shared_ptr<CommHook>;

// The default: allreduce with ReduceOp::Avg in place, with the given
// timeout (kUseGroupTimeout: the group's).
class AllreduceAvgHook : public CommHook {
 public:
  explicit AllreduceAvgHook(Milliseconds timeout = kUseGroupTimeout) : timeout_(timeout) {}
  WorkPtr run(ProcessGroup& group, GradBucket& bucket) override;

 private:
  Milliseconds timeout_;
};

// thenWork (framework/comm/work.hpp) chains a step after a collective.

}  // namespace ddp
