#include "framework/parallel/local_strategy.hpp"

#include <torch/serialize.h>

namespace ddp {

LocalStrategy::LocalStrategy(std::shared_ptr<torch::nn::Module> model,
                             std::unique_ptr<torch::optim::Optimizer> optimizer)
    : model_(std::move(model)), optimizer_(std::move(optimizer)), params_(model_->parameters()),
      hadGrad_(params_.size(), 0) {}

void LocalStrategy::backward(const at::Tensor& loss, bool /*lastMicroBatch*/) { loss.backward(); }

void LocalStrategy::step() {
  // Zeros where zero_grad() would have left them.
  for (size_t i = 0; i < params_.size(); ++i) {
    if (hadGrad_[i] && !params_[i].grad().defined()) params_[i].mutable_grad() = at::zeros_like(params_[i]);
  }
  clipGradients(nullptr);
  optimizer_->step();
  // Instead of zero_grad().
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& grad = params_[i].mutable_grad();
    if (grad.defined()) {
      hadGrad_[i] = 1;
      grad.reset();
    }
  }
}

void LocalStrategy::saveState(torch::serialize::OutputArchive* archive) {
  if (archive) saveModelAndOptimizer(*archive, *model_, *optimizer_);
}

}  // namespace ddp
