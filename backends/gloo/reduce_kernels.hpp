// Elementwise reductions dst[i] = dst[i] op src[i], the inner loops of the
// Gloo backend's ring and shared-memory collectives. They live in a file
// without LibTorch headers so that it can be compiled with -O3: GCC's -O2
// leaves these loops scalar.
#pragma once

#include <cstddef>

namespace ddp {

// The operation numbers of ReduceOp (checked where both are visible).
enum : int { kReduceSum = 0, kReduceAvg = 1, kReduceMin = 2, kReduceMax = 3, kReduceProduct = 4 };

// Avg sums; the caller divides. 16-bit floats reduce in float32 and round
// once per call.
void reduceFloat(void* dst, const void* src, size_t n, int op);
void reduceDouble(void* dst, const void* src, size_t n, int op);
void reduceInt32(void* dst, const void* src, size_t n, int op);
void reduceInt64(void* dst, const void* src, size_t n, int op);
void reduceHalf(void* dst, const void* src, size_t n, int op);
void reduceBFloat16(void* dst, const void* src, size_t n, int op);

}  // namespace ddp
