#include "plugins/kernels/adam_kernel.hpp"

#include <algorithm>
#include <cmath>

namespace ddp::plugins {
namespace {

// The loop body, specialised on the options so that the hot loop has no
// branches (a branch in the loop keeps GCC from vectorizing it).
template <typename T, bool CoupledDecay, bool DecoupledDecay, bool AmsGrad>
void adamLoop(const AdamStep& s, T* __restrict param, const T* __restrict grad, T* __restrict expAvg,
              T* __restrict expAvgSq, T* __restrict maxExpAvgSq, int64_t begin, int64_t end) {
  const T beta1 = static_cast<T>(s.beta1);
  const T oneMinusBeta1 = static_cast<T>(1 - s.beta1);
  const T beta2 = static_cast<T>(s.beta2);
  const T oneMinusBeta2 = static_cast<T>(1 - s.beta2);
  const T eps = static_cast<T>(s.eps);
  const T weightDecay = static_cast<T>(s.weightDecay);
  const T decayFactor = static_cast<T>(1 - s.lr * s.weightDecay);
  const T sqrtBiasCorrection2 = static_cast<T>(std::sqrt(s.biasCorrection2));
  const T negStepSize = static_cast<T>(-(s.lr / s.biasCorrection1));
  for (int64_t i = begin; i < end; ++i) {
    T p = param[i];
    T g = grad[i];
    if (CoupledDecay) g = g + weightDecay * p;  // grad.add(p, weight_decay)
    if (DecoupledDecay) p = p * decayFactor;    // p.mul_(1 - lr * weight_decay)
    const T m = expAvg[i] * beta1 + oneMinusBeta1 * g;
    const T v = expAvgSq[i] * beta2 + oneMinusBeta2 * g * g;
    expAvg[i] = m;
    expAvgSq[i] = v;
    T vUsed = v;
    if (AmsGrad) {
      vUsed = maxExpAvgSq[i] < v ? v : maxExpAvgSq[i];
      maxExpAvgSq[i] = vUsed;
    }
    const T denom = std::sqrt(vUsed) / sqrtBiasCorrection2 + eps;
    param[i] = p + negStepSize * (m / denom);
  }
}

}  // namespace

template <typename T>
void adamKernel(const AdamStep& s, T* param, const T* grad, T* expAvg, T* expAvgSq, T* maxExpAvgSq, int64_t begin,
                int64_t end) {
  const bool coupled = !s.decoupled && s.weightDecay != 0;
  const bool decoupled = s.decoupled && s.weightDecay != 0;
  const bool ams = maxExpAvgSq != nullptr;
  if (ams) {
    if (coupled) return adamLoop<T, true, false, true>(s, param, grad, expAvg, expAvgSq, maxExpAvgSq, begin, end);
    if (decoupled) return adamLoop<T, false, true, true>(s, param, grad, expAvg, expAvgSq, maxExpAvgSq, begin, end);
    return adamLoop<T, false, false, true>(s, param, grad, expAvg, expAvgSq, maxExpAvgSq, begin, end);
  }
  if (coupled) return adamLoop<T, true, false, false>(s, param, grad, expAvg, expAvgSq, nullptr, begin, end);
  if (decoupled) return adamLoop<T, false, true, false>(s, param, grad, expAvg, expAvgSq, nullptr, begin, end);
  return adamLoop<T, false, false, false>(s, param, grad, expAvg, expAvgSq, nullptr, begin, end);
}

template void adamKernel<float>(const AdamStep&, float*, const float*, float*, float*, float*, int64_t, int64_t);
template void adamKernel<double>(const AdamStep&, double*, const double*, double*, double*, double*, int64_t,
                                 int64_t);

}  // namespace ddp::plugins
