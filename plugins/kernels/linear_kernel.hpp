// A Linear layer's forward and backward on small row-major arrays, for the
// mlp model's autograd node (models.cpp).
//
// Why: at the wine MLP's sizes (batch 32, 13 -> 64 -> 3) each of the five
// matrix products of a training step does a few thousand multiply-adds, and
// going through LibTorch for it (dispatcher, output allocation, OpenBLAS's
// argument checks, packing and beta pass, then separate bias, relu and sum
// ops) costs several times the arithmetic. These loops do the arithmetic
// directly, with the bias, relu and bias-gradient sums fused in. Like
// adam_kernel.cpp the file includes no LibTorch header, is compiled -O3
// -fno-math-errno, and is built for AVX2+FMA as well as the baseline ISA,
// picked at run time.
//
// Results: every output element is accumulated in a fixed order (over the
// shared dimension, first to last; sums over the batch, first row to last),
// so a given machine gives the same bits every run. They are not bit-equal
// to OpenBLAS's, which orders and fuses its sums differently: expect
// differences at float rounding level. Callers use these only below
// kSmallLinearMacs multiply-adds per product; larger layers go to ATen
// (OpenBLAS), whose blocking wins there.
#pragma once

#include <cstdint>

namespace ddp::plugins {

// n * in * out at or below this: the loops here; above: ATen.
constexpr int64_t kSmallLinearMacs = int64_t{1} << 16;

// y[n, out] = x[n, in] w[out, in]^T + b[out] (b may be null), then
// y = max(y, 0) when relu (NaN stays NaN, as torch.relu). All contiguous.
template <typename T>
void linearForward(const T* x, const T* w, const T* b, T* y, int64_t n, int64_t in, int64_t out, bool relu);

// From g[n, out], the gradient with respect to the layer's pre-activation
// output: dw[out, in] = g^T x; db[out] = sum of g's rows (skipped when db
// is null); dx[n, in] = g w (skipped when dx is null). All contiguous; the
// outputs are overwritten.
template <typename T>
void linearBackward(const T* g, const T* x, const T* w, T* dw, T* db, T* dx, int64_t n, int64_t in, int64_t out);

// out[i] = y[i] > 0 ? g[i] : 0, the relu derivative given relu's output (as
// threshold_backward(g, y, 0)).
template <typename T>
void reluBackward(const T* g, const T* y, T* out, int64_t count);

}  // namespace ddp::plugins
