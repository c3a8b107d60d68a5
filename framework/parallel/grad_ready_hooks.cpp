#include "framework/parallel/grad_ready_hooks.hpp"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "framework/core/errors.hpp"

namespace ddp {

class GradReadyHooks::Hook : public torch::autograd::FunctionPostHook {
 public:
  Hook(const Callback* callback, size_t index) : callback_(callback), index_(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    (*callback_)(index_);
    return outputs;
  }

 private:
  const Callback* callback_;
  size_t index_;
};

GradReadyHooks::GradReadyHooks(const std::vector<at::Tensor>& params, Callback callback)
    : callback_(std::move(callback)) {
  for (size_t i = 0; i < params.size(); ++i) {
    // The variable holds its accumulator weakly: holding it keeps the same
    // node, and our hook, across iterations.
    auto accumulator = torch::autograd::impl::grad_accumulator(params[i]);
    DDP_CHECK(accumulator != nullptr, "GradReadyHooks: a parameter without a gradient accumulator");
    keys_.push_back(accumulator->add_post_hook(std::make_unique<Hook>(&callback_, i)));
    accumulators_.push_back(std::move(accumulator));
  }
}

GradReadyHooks::~GradReadyHooks() {
  for (size_t i = 0; i < accumulators_.size(); ++i) accumulators_[i]->del_post_hook(keys_[i]);
}

}  // namespace ddp
