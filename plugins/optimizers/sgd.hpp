// The built-in SGD ("optimizer.sgd"): torch::optim::SGD, whose load() also
// restores the groups' options (lr, momentum, ...), as PyTorch's
// load_state_dict does.
//
// Contract
// - Parameters: lr > 0, momentum in [0, 1), weight_decay >= 0, nesterov
//   (needs momentum > 0; otherwise a UsageError).
#pragma once

#include <memory>
#include <vector>

#include "framework/experiment/plugin_registry.hpp"

namespace ddp::plugins {

std::unique_ptr<torch::optim::Optimizer> makeSgd(std::vector<at::Tensor> parameters, const Params& params);

}  // namespace ddp::plugins
