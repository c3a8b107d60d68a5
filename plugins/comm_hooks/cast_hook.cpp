#include "plugins/comm_hooks/cast_hook.hpp"

#include <ATen/ATen.h>

#include "framework/core/errors.hpp"

namespace ddp::plugins {

CastHook::CastHook(at::ScalarType wire, Milliseconds timeout) : wire_(wire), timeout_(timeout) {
  DDP_CHECK(wire == at::kHalf || wire == at::kBFloat16, "CastHook: the wire type must be float16 or bfloat16");
  DDP_CHECK(timeout.count() > 0, "CastHook: the timeout must be given (the group's is not known here)");
}

WorkPtr CastHook::run(ProcessGroup& group, GradBucket& bucket) {
  at::Tensor wire;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    at::Tensor& cached = buffers_[bucket.index];
    if (!cached.defined() || cached.numel() != bucket.buffer.numel() || cached.device() != bucket.buffer.device()) {
      cached = at::empty({bucket.buffer.numel()}, bucket.buffer.options().dtype(wire_));
    }
    wire = cached;
  }
  // Divide in the gradients' own precision, then round once.
  at::div_out(wire, bucket.buffer, at::scalar_tensor(static_cast<double>(group.size()), bucket.buffer.options()));
  AllreduceOptions opts;
  opts.op = ReduceOp::Sum;
  opts.timeout = timeout_;
  WorkPtr sum = group.allreduce(wire, opts);
  at::Tensor out = bucket.buffer;
  return thenWork(sum, timeout_, [out, wire]() mutable { out.copy_(wire); });
}

}  // namespace ddp::plugins
