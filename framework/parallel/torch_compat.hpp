// Where LibTorch 1.x and 2.x differ in behaviour that the framework relies
// on, one spelling that behaves the same under both.
#pragma once

#include <torch/optim/optimizer.h>

namespace ddp {

namespace detail {
// LibTorch 2.x: zero_grad(bool set_to_none = true).
template <typename Optimizer>
auto zeroGradientsInPlace(Optimizer& optimizer, int) -> decltype(optimizer.zero_grad(false), void()) {
  optimizer.zero_grad(/*set_to_none=*/false);
}
// LibTorch 1.x: zero_grad() zeroes in place.
template <typename Optimizer>
void zeroGradientsInPlace(Optimizer& optimizer, long) {
  optimizer.zero_grad();
}
}  // namespace detail

// Zeroes every parameter's gradient in place, keeping its tensor, as
// LibTorch 1.x's optimizer.zero_grad() does. LibTorch 2.x's zero_grad()
// drops the gradients instead (set_to_none defaults to true), which changes
// two things: an optimizer skips a parameter without a gradient where it
// would step one with a zero gradient (Adam's moments keep moving it), and
// DistributedDataParallel's gradients stop sharing memory with its buckets
// (gradientAsBucketView), so every step copies them in and out again.
inline void zeroGradients(torch::optim::Optimizer& optimizer) { detail::zeroGradientsInPlace(optimizer, 0); }

}  // namespace ddp
