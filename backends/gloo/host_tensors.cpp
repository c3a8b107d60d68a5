#include "backends/gloo/host_tensors.hpp"

#include <algorithm>

#include "backends/gloo/reduce_kernels.hpp"
#include "framework/core/errors.hpp"

namespace ddp::gloo_backend {

static_assert(static_cast<int>(ReduceOp::Sum) == kReduceSum && static_cast<int>(ReduceOp::Avg) == kReduceAvg &&
                  static_cast<int>(ReduceOp::Min) == kReduceMin && static_cast<int>(ReduceOp::Max) == kReduceMax &&
                  static_cast<int>(ReduceOp::Product) == kReduceProduct,
              "reduce_kernels.hpp must number the operations as ReduceOp does");

ReduceFn reduceFnFor(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return reduceFloat;
    case at::kDouble: return reduceDouble;
    case at::kInt: return reduceInt32;
    case at::kLong: return reduceInt64;
    case at::kHalf: return reduceHalf;
    case at::kBFloat16: return reduceBFloat16;
    default: return nullptr;
  }
}

void requireSupported(const at::Tensor& t, const char* op) {
  if (!reduceFnFor(t.scalar_type())) {
    fail<UsageError>("gloo {}: dtype {} is not supported; use float32, float64, float16, bfloat16, int32 or int64",
                     op, c10::toString(t.scalar_type()));
  }
}

at::Tensor hostView(const at::Tensor& t) {
  if (t.is_cpu() && t.is_contiguous()) return t;
  return t.to(at::kCPU).contiguous();
}

void divideInPlace(at::Tensor t, int64_t divisor) {
  if (at::isIntegralType(t.scalar_type(), /*includeBool=*/false)) {
    t.div_(divisor, "trunc");
  } else {
    t.div_(static_cast<double>(divisor));
  }
}

std::string summarize(const at::Tensor& t, const char* extra) {
  return extra ? fmt::format("{} elements, {}, {}", t.numel(), dtypeName(t), extra)
               : fmt::format("{} elements, {}", t.numel(), dtypeName(t));
}

std::chrono::milliseconds remaining(Deadline deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return std::max(left, std::chrono::milliseconds(1));
}

}  // namespace ddp::gloo_backend
