// Optimizers: registration of the built-in ones (the implementations live in
// plugins/optimizers/: SGD, and Adam / AdamW with a fused update).
#include "plugins/common.hpp"
#include "plugins/optimizers/adam.hpp"
#include "plugins/optimizers/sgd.hpp"

namespace ddp::plugins {

namespace {

// Shared by adam and adamw, which differ in weight decay.
std::vector<ParamSpec> adamParams(double defaultWeightDecay, const std::string& weightDecayDoc) {
  return {
      Param("lr", ParamType::Float, 1e-3, "learning rate").above(0),
      Param("beta1", ParamType::Float, 0.9, "decay of the gradient average").atLeast(0).below(1),
      Param("beta2", ParamType::Float, 0.999, "decay of the squared-gradient average").atLeast(0).below(1),
      Param("eps", ParamType::Float, 1e-8, "added to the denominator for stability").atLeast(0),
      Param("weight_decay", ParamType::Float, defaultWeightDecay, weightDecayDoc).atLeast(0),
  };
}

}  // namespace

void registerOptimizers(PluginRegistry& registry) {
  registry.add({"sgd",
                "stochastic gradient descent with optional (Nesterov) momentum",
                {
                    Param("lr", ParamType::Float, 0.01, "learning rate").above(0),
                    Param("momentum", ParamType::Float, 0.0, "momentum factor").atLeast(0).below(1),
                    Param("weight_decay", ParamType::Float, 0.0, "L2 penalty added to the gradient").atLeast(0),
                    Param("nesterov", ParamType::Bool, false, "Nesterov momentum (needs momentum > 0)"),
                },
                makeSgd});
  registry.add({"adam", "Adam with bias correction (fused CPU update; same results as torch.optim.Adam)",
                adamParams(0.0, "L2 penalty added to the gradient"), makeAdam});
  registry.add({"adamw", "Adam with decoupled weight decay (fused CPU update; same results as torch.optim.AdamW)",
                adamParams(0.01, "decoupled decay: weights shrink by lr * weight_decay per step"), makeAdamW});
}

}  // namespace ddp::plugins
