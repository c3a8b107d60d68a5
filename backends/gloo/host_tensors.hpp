// Helpers every Gloo collective shares: the reduction kernel for a dtype
// (reduce_kernels.hpp), the dtype check, host staging of non-contiguous or
// non-CPU tensors, Avg's division, and the time left to a deadline.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <string>

#include "framework/comm/process_group.hpp"

namespace ddp::gloo_backend {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

// reduce(inout, in, count, reduceOp) for one dtype.
using ReduceFn = void (*)(void*, const void*, size_t, int);

// The kernel for `type`, or null when Gloo collectives do not support it.
ReduceFn reduceFnFor(at::ScalarType type);

// Throws UsageError naming the operation when `t`'s dtype is unsupported.
void requireSupported(const at::Tensor& t, const char* op);

// A contiguous host tensor that aliases `t` when it can, or a staged copy.
at::Tensor hostView(const at::Tensor& t);

// t /= divisor, truncating for integer dtypes (ReduceOp::Avg).
void divideInPlace(at::Tensor t, int64_t divisor);

// "1000 elements, float32[, extra]": how a collective names its data.
std::string summarize(const at::Tensor& t, const char* extra = nullptr);

// Time left until `deadline`, at least 1 ms (Gloo treats 0 as "no timeout").
std::chrono::milliseconds remaining(Deadline deadline);

}  // namespace ddp::gloo_backend
