#include "plugins/kernels/linear_kernel.hpp"

#include <cstring>
#include <vector>

namespace ddp::plugins {
namespace {

#define DDP_INLINE inline __attribute__((always_inline))

// c[m, :] += sum over k of a(m, k) * b[k, :], for m < rows: c is [rows, cols],
// b is [depth, cols], a(m, k) = a[m * am + k * ak]. The innermost loop runs
// along a row of c and b, which GCC vectorizes.
template <typename T>
DDP_INLINE void accumulateRows(T* __restrict c, const T* __restrict a, int64_t am, int64_t ak, const T* __restrict b,
                               int64_t rows, int64_t cols, int64_t depth) {
  for (int64_t m = 0; m < rows; ++m) {
    T* __restrict cm = c + m * cols;
    for (int64_t k = 0; k < depth; ++k) {
      const T s = a[m * am + k * ak];
      const T* __restrict bk = b + k * cols;
      for (int64_t j = 0; j < cols; ++j) cm[j] += s * bk[j];
    }
  }
}

// sum of a[k] * b[k], in eight fixed lanes (vectorizable, and the same order
// every time), then the lanes pairwise, then the tail.
template <typename T>
DDP_INLINE T dot(const T* __restrict a, const T* __restrict b, int64_t n) {
  T acc[8] = {};
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += a[k + j] * b[k + j];
  }
  T tail = 0;
  for (; k < n; ++k) tail += a[k] * b[k];
  return (((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))) + tail;
}

// to[c, r] = from[r, c] for a [rows, cols] array.
template <typename T>
DDP_INLINE void transpose(const T* __restrict from, T* __restrict to, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) to[c * rows + r] = from[r * cols + c];
  }
}

template <typename T>
T* scratch(size_t count) {
  thread_local std::vector<T> buffer;
  if (buffer.size() < count) buffer.resize(count);
  return buffer.data();
}

// A row shorter than this is a poor vector: take the other loop order.
constexpr int64_t kShortRow = 8;

template <typename T>
DDP_INLINE void forwardImpl(const T* __restrict x, const T* __restrict w, const T* __restrict b, T* __restrict y,
                            int64_t n, int64_t in, int64_t out, bool relu) {
  if (out >= kShortRow) {
    // Along y's rows: y[i, :] = b + sum over k of x[i, k] * w^T[k, :].
    T* wt = scratch<T>(static_cast<size_t>(in * out));
    transpose(w, wt, out, in);
    for (int64_t i = 0; i < n; ++i) {
      T* yi = y + i * out;
      if (b) {
        for (int64_t o = 0; o < out; ++o) yi[o] = b[o];
      } else {
        for (int64_t o = 0; o < out; ++o) yi[o] = 0;
      }
    }
    accumulateRows(y, x, in, 1, wt, n, out, in);
  } else {
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t o = 0; o < out; ++o) y[i * out + o] = (b ? b[o] : T(0)) + dot(x + i * in, w + o * in, in);
    }
  }
  if (relu) {
    const int64_t count = n * out;
    for (int64_t i = 0; i < count; ++i) y[i] = y[i] < 0 ? T(0) : y[i];
  }
}

template <typename T>
DDP_INLINE void backwardImpl(const T* __restrict g, const T* __restrict x, const T* __restrict w, T* __restrict dw,
                             T* __restrict db, T* __restrict dx, int64_t n, int64_t in, int64_t out) {
  if (db) {
    for (int64_t o = 0; o < out; ++o) db[o] = 0;
    for (int64_t i = 0; i < n; ++i) {
      const T* gi = g + i * out;
      for (int64_t o = 0; o < out; ++o) db[o] += gi[o];
    }
  }
  if (dw) {
    // dw[o, k] = sum over i of g[i, o] * x[i, k]
    if (in >= out) {
      std::memset(dw, 0, sizeof(T) * static_cast<size_t>(out * in));
      accumulateRows(dw, g, 1, out, x, out, in, n);
    } else {
      T* dwt = scratch<T>(static_cast<size_t>(in * out));
      std::memset(dwt, 0, sizeof(T) * static_cast<size_t>(out * in));
      accumulateRows(dwt, x, 1, in, g, in, out, n);
      transpose(dwt, dw, in, out);
    }
  }
  if (dx) {
    // dx[i, k] = sum over o of g[i, o] * w[o, k]
    if (in >= kShortRow || in >= out) {
      std::memset(dx, 0, sizeof(T) * static_cast<size_t>(n * in));
      accumulateRows(dx, g, out, 1, w, n, in, out);
    } else {
      T* wt = scratch<T>(static_cast<size_t>(in * out));
      transpose(w, wt, out, in);
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t k = 0; k < in; ++k) dx[i * in + k] = dot(g + i * out, wt + k * out, out);
      }
    }
  }
}

template <typename T>
DDP_INLINE void reluBackwardImpl(const T* __restrict g, const T* __restrict y, T* __restrict out, int64_t count) {
  for (int64_t i = 0; i < count; ++i) out[i] = y[i] > 0 ? g[i] : T(0);
}

// Each entry point twice: for the baseline ISA and for AVX2 with FMA, the
// latter taken when the CPU has both.
#if defined(__x86_64__) && defined(__GNUC__)
#define DDP_AVX2_CLONE 1
#define DDP_AVX2 __attribute__((target("avx2,fma")))
bool hasAvx2Fma() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return has;
}
#endif

template <typename T>
void forwardBase(const T* x, const T* w, const T* b, T* y, int64_t n, int64_t in, int64_t out, bool relu) {
  forwardImpl(x, w, b, y, n, in, out, relu);
}
template <typename T>
void backwardBase(const T* g, const T* x, const T* w, T* dw, T* db, T* dx, int64_t n, int64_t in, int64_t out) {
  backwardImpl(g, x, w, dw, db, dx, n, in, out);
}
template <typename T>
void reluBackwardBase(const T* g, const T* y, T* out, int64_t count) {
  reluBackwardImpl(g, y, out, count);
}

#ifdef DDP_AVX2_CLONE
template <typename T>
DDP_AVX2 void forwardAvx2(const T* x, const T* w, const T* b, T* y, int64_t n, int64_t in, int64_t out, bool relu) {
  forwardImpl(x, w, b, y, n, in, out, relu);
}
template <typename T>
DDP_AVX2 void backwardAvx2(const T* g, const T* x, const T* w, T* dw, T* db, T* dx, int64_t n, int64_t in,
                           int64_t out) {
  backwardImpl(g, x, w, dw, db, dx, n, in, out);
}
template <typename T>
DDP_AVX2 void reluBackwardAvx2(const T* g, const T* y, T* out, int64_t count) {
  reluBackwardImpl(g, y, out, count);
}
#endif

}  // namespace

template <typename T>
void linearForward(const T* x, const T* w, const T* b, T* y, int64_t n, int64_t in, int64_t out, bool relu) {
#ifdef DDP_AVX2_CLONE
  if (hasAvx2Fma()) return forwardAvx2(x, w, b, y, n, in, out, relu);
#endif
  forwardBase(x, w, b, y, n, in, out, relu);
}

template <typename T>
void linearBackward(const T* g, const T* x, const T* w, T* dw, T* db, T* dx, int64_t n, int64_t in, int64_t out) {
#ifdef DDP_AVX2_CLONE
  if (hasAvx2Fma()) return backwardAvx2(g, x, w, dw, db, dx, n, in, out);
#endif
  backwardBase(g, x, w, dw, db, dx, n, in, out);
}

template <typename T>
void reluBackward(const T* g, const T* y, T* out, int64_t count) {
#ifdef DDP_AVX2_CLONE
  if (hasAvx2Fma()) return reluBackwardAvx2(g, y, out, count);
#endif
  reluBackwardBase(g, y, out, count);
}

template void linearForward<float>(const float*, const float*, const float*, float*, int64_t, int64_t, int64_t, bool);
template void linearForward<double>(const double*, const double*, const double*, double*, int64_t, int64_t, int64_t,
                                    bool);
template void linearBackward<float>(const float*, const float*, const float*, float*, float*, float*, int64_t,
                                    int64_t, int64_t);
template void linearBackward<double>(const double*, const double*, const double*, double*, double*, double*, int64_t,
                                     int64_t, int64_t);
template void reluBackward<float>(const float*, const float*, float*, int64_t);
template void reluBackward<double>(const double*, const double*, double*, int64_t);

}  // namespace ddp::plugins
