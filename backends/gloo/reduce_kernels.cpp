#include "backends/gloo/reduce_kernels.hpp"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>

namespace ddp {
namespace {

template <typename T>
void reduceInto(void* dstRaw, const void* srcRaw, size_t n, int op) {
  T* __restrict dst = static_cast<T*>(dstRaw);
  const T* __restrict src = static_cast<const T*>(srcRaw);
  switch (op) {
    case kReduceSum:
    case kReduceAvg:
      for (size_t i = 0; i < n; ++i) dst[i] = dst[i] + src[i];
      break;
    case kReduceProduct:
      for (size_t i = 0; i < n; ++i) dst[i] = dst[i] * src[i];
      break;
    case kReduceMin:
      for (size_t i = 0; i < n; ++i) dst[i] = src[i] < dst[i] ? src[i] : dst[i];
      break;
    case kReduceMax:
      for (size_t i = 0; i < n; ++i) dst[i] = dst[i] < src[i] ? src[i] : dst[i];
      break;
  }
}

// 16-bit floats reduce in float32 and round once per step.
template <typename T>
void reduceInto16(void* dstRaw, const void* srcRaw, size_t n, int op) {
  T* dst = static_cast<T*>(dstRaw);
  const T* src = static_cast<const T*>(srcRaw);
  for (size_t i = 0; i < n; ++i) {
    float a = static_cast<float>(dst[i]), b = static_cast<float>(src[i]);
    float r;
    switch (op) {
      case kReduceProduct: r = a * b; break;
      case kReduceMin: r = b < a ? b : a; break;
      case kReduceMax: r = a < b ? b : a; break;
      default: r = a + b; break;
    }
    dst[i] = static_cast<T>(r);
  }
}

}  // namespace

void reduceFloat(void* dst, const void* src, size_t n, int op) { reduceInto<float>(dst, src, n, op); }
void reduceDouble(void* dst, const void* src, size_t n, int op) { reduceInto<double>(dst, src, n, op); }
void reduceInt32(void* dst, const void* src, size_t n, int op) { reduceInto<int32_t>(dst, src, n, op); }
void reduceInt64(void* dst, const void* src, size_t n, int op) { reduceInto<int64_t>(dst, src, n, op); }
void reduceHalf(void* dst, const void* src, size_t n, int op) { reduceInto16<c10::Half>(dst, src, n, op); }
void reduceBFloat16(void* dst, const void* src, size_t n, int op) { reduceInto16<c10::BFloat16>(dst, src, n, op); }

}  // namespace ddp
