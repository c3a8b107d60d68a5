// SingleProcessGroup: the ProcessGroup of a run with one rank, for builds
// without the configured backend (an NCCL-only GPU build running a config
// that names "gloo", say). With one rank every collective is the identity:
// allreduce (any op, avg included) and broadcast leave the tensor as it is,
// allgather and reduce_scatter copy input to output, barrier returns.
#pragma once

#include <ATen/core/Tensor.h>

#include "framework/core/errors.hpp"
#include "framework/comm/process_group.hpp"

namespace ddp {

class SingleProcessGroup : public ProcessGroup {
 public:
  explicit SingleProcessGroup(ProcessGroupOptions options = {}) : ProcessGroup(0, 1, std::move(options)) {}
  std::string backendName() const override { return "single"; }

  WorkPtr allreduce(at::Tensor&, const AllreduceOptions& = {}) override { return done("allreduce"); }
  WorkPtr broadcast(at::Tensor&, const BroadcastOptions& opts = {}) override {
    if (opts.root != 0) fail<UsageError>("broadcast: root {} is outside world size 1", opts.root);
    return done("broadcast");
  }
  WorkPtr allgather(const at::Tensor& input, at::Tensor& output, const AllgatherOptions& = {}) override {
    copyAll(input, output, "allgather");
    return done("allgather");
  }
  WorkPtr reduceScatter(const at::Tensor& input, at::Tensor& output, const ReduceScatterOptions& = {}) override {
    copyAll(input, output, "reduce_scatter");
    return done("reduce_scatter");
  }
  WorkPtr barrier(const BarrierOptions& = {}) override { return done("barrier"); }

 private:
  static WorkPtr done(const char* op) { return Work::completed(fmt::format("single {}", op)); }
  static void copyAll(const at::Tensor& input, at::Tensor& output, const char* op) {
    if (input.numel() != output.numel()) {
      fail<UsageError>("{} at world size 1: output must have as many elements as input; got {} and {}", op,
                       input.numel(), output.numel());
    }
    if (input.numel() > 0) output.view({-1}).copy_(input.reshape({-1}));
  }
};

}  // namespace ddp
