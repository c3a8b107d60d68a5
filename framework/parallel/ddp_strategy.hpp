// DdpStrategy: ParallelStrategy (strategy.hpp) over DistributedDataParallel
// (ddp.hpp). Every rank holds the whole model and optimizer; gradients are
// averaged in buckets during the last micro-batch's backward, then every
// rank takes the same optimizer step and zeroes gradients in place (they
// are views into DDP's buckets). The state saved is rank 0's, which every
// rank shares.
#pragma once

#include <memory>

#include "framework/parallel/ddp.hpp"
#include "framework/parallel/strategy.hpp"

namespace ddp {

class DdpStrategy : public ParallelStrategy {
 public:
  // Takes the optimizer from `context` last, once DDP is built: if that
  // throws, the optimizer is still in `context` (strategy.hpp).
  explicit DdpStrategy(StrategyContext&& context);

  const char* name() const override { return "ddp"; }
  torch::nn::Module& model() override { return *model_; }
  torch::optim::Optimizer& optimizer() override { return *optimizer_; }
  void backward(const at::Tensor& loss, bool lastMicroBatch) override;
  void step() override;  // clips (setGradientClipping) before the optimizer steps
  bool supportsGradientClipping() const override { return true; }
  std::unique_ptr<torch::optim::Optimizer> releaseOptimizer() override { return std::move(optimizer_); }
  void saveState(torch::serialize::OutputArchive* archive) override;
  // Every rank holds everything; each writes its 1/world of every tensor.
  HeldState heldState() override;
  bool supportsJoin() const override { return true; }
  // The wait after backward, and the collectives that ran inside the hooks
  // during it (waiting for the peers there too).
  std::optional<double> lastGradientWaitSeconds() const override { return ddp_->lastSyncWaitSeconds(); }
  void setContributors(int contributors) override { ddp_->setContributors(contributors); }
  void shadowBackward() override { ddp_->shadowBackward(); }

  DistributedDataParallel& ddp() { return *ddp_; }

 private:
  std::shared_ptr<torch::nn::Module> model_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::unique_ptr<DistributedDataParallel> ddp_;
};

}  // namespace ddp
