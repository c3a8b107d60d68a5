// GradReadyHooks: a callback for each parameter as soon as backward has
// accumulated its gradient into param.grad(), for strategies that start
// communicating during backward (zero2).
//
// Contract
// - The callback gets the parameter's index in the list given, once per
//   backward pass in which the parameter received a gradient, after
//   param.grad() holds it. It may read, copy or reset param.grad().
// - It may run on autograd's threads; calls are not serialised here.
// - The destructor removes the hooks. The parameters must outlive this.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <vector>

namespace torch::autograd {
struct Node;
}

namespace ddp {

class GradReadyHooks {
 public:
  using Callback = std::function<void(size_t index)>;
  GradReadyHooks(const std::vector<at::Tensor>& params, Callback callback);
  ~GradReadyHooks();
  GradReadyHooks(const GradReadyHooks&) = delete;
  GradReadyHooks& operator=(const GradReadyHooks&) = delete;

 private:
  class Hook;
  Callback callback_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;  // kept alive with our hooks
  std::vector<uintptr_t> keys_;
};

}  // namespace ddp
