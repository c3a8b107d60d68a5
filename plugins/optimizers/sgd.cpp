// SGD: LibTorch's, with load() restoring the groups' options (sgd.hpp).
#include "plugins/optimizers/sgd.hpp"

#include <torch/optim/sgd.h>

#include <utility>

#include "plugins/common.hpp"
#include "plugins/optimizers/group_options.hpp"

namespace ddp::plugins {

namespace {

class Sgd : public torch::optim::SGD {
 public:
  using torch::optim::SGD::SGD;
  void load(torch::serialize::InputArchive& archive) override {
    torch::optim::SGD::load(archive);
    restoreGroupOptions<torch::optim::SGDOptions>(archive, *this);
  }
};

}  // namespace

std::unique_ptr<torch::optim::Optimizer> makeSgd(std::vector<at::Tensor> parameters, const Params& params) {
  const double momentum = params.getDouble("momentum");
  const bool nesterov = params.getBool("nesterov");
  requireBelow(kOptimizer, "momentum", momentum, 1.0);
  if (nesterov && momentum <= 0) paramError(kOptimizer, "nesterov", "needs momentum > 0");
  torch::optim::SGDOptions options(params.getDouble("lr"));
  options.momentum(momentum).weight_decay(params.getDouble("weight_decay")).nesterov(nesterov);
  return std::make_unique<Sgd>(std::move(parameters), options);
}

}  // namespace ddp::plugins
