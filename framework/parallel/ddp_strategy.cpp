#include "framework/parallel/ddp_strategy.hpp"

#include <torch/serialize.h>

#include "framework/parallel/torch_compat.hpp"

namespace ddp {

DdpStrategy::DdpStrategy(StrategyContext&& context) : model_(context.model) {
  ddp_ = std::make_unique<DistributedDataParallel>(model_, context.group, context.ddp);
  optimizer_ = std::move(context.optimizer);
}

void DdpStrategy::backward(const at::Tensor& loss, bool lastMicroBatch) {
  if (lastMicroBatch) {
    loss.backward();
  } else {
    auto guard = ddp_->noSync();
    loss.backward();
  }
}

void DdpStrategy::step() {
  ddp_->finishGradientSync();
  clipGradients(nullptr);
  optimizer_->step();
  zeroGradients(*optimizer_);  // in place, keeping DDP's bucket views
}

void DdpStrategy::saveState(torch::serialize::OutputArchive* archive) {
  if (archive) saveModelAndOptimizer(*archive, *model_, *optimizer_);
}

HeldState DdpStrategy::heldState() {
  const ProcessGroup& group = ddp_->group();
  return wholeHeldState(*model_, *optimizer_, group.size(), group.rank());
}

}  // namespace ddp
