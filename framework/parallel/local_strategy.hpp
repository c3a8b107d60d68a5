// LocalStrategy: one rank, nothing to synchronise (ParallelStrategy's
// contract, strategy.hpp).
//
// Gradients are dropped after each step instead of zeroed, so the next
// backward hands its fresh gradient tensors to the parameters (no zero
// pass, and no addition into zeros). To keep zeroing's semantics exactly
// (LibTorch 1.x's zero_grad(); 2.x's with set_to_none = false), a parameter
// that had a gradient and got none from the next backward (unused this
// step) is given zeros again before the optimizer sees it: the optimizer
// steps the same parameters with the same values.
#pragma once

#include <memory>
#include <vector>

#include "framework/parallel/strategy.hpp"

namespace ddp {

class LocalStrategy : public ParallelStrategy {
 public:
  LocalStrategy(std::shared_ptr<torch::nn::Module> model, std::unique_ptr<torch::optim::Optimizer> optimizer);

  const char* name() const override { return "local"; }
  torch::nn::Module& model() override { return *model_; }
  torch::optim::Optimizer& optimizer() override { return *optimizer_; }
  void backward(const at::Tensor& loss, bool lastMicroBatch) override;
  void step() override;  // clips (setGradientClipping) before the optimizer steps
  bool supportsGradientClipping() const override { return true; }
  std::unique_ptr<torch::optim::Optimizer> releaseOptimizer() override { return std::move(optimizer_); }
  void saveState(torch::serialize::OutputArchive* archive) override;
  std::optional<double> lastGradientWaitSeconds() const override { return 0.0; }  // nothing to wait for

 private:
  std::shared_ptr<torch::nn::Module> model_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::vector<at::Tensor> params_;
  std::vector<char> hadGrad_;
};

}  // namespace ddp
