// restoreGroupOptions: what LibTorch's Optimizer::load() leaves out. Used
// by the built-in optimizers' load() (adam.cpp, sgd.cpp).
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/optim/serialize.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ddp::plugins {

// LibTorch's load() restores each parameter's state but leaves the groups'
// options (lr, weight decay, ...) as constructed; PyTorch's load_state_dict
// restores them, and so does this, so that a resumed run continues with the
// lr it had.
template <typename Options>
void restoreGroupOptions(torch::serialize::InputArchive& archive, torch::optim::Optimizer& optimizer) {
  torch::serialize::InputArchive groupsArchive;
  archive.read("param_groups", groupsArchive);
  std::vector<std::pair<std::vector<std::string>, std::unique_ptr<torch::optim::OptimizerOptions>>> saved;
  torch::optim::detail::serialize<Options>(groupsArchive, saved);
  auto& groups = optimizer.param_groups();
  for (size_t i = 0; i < saved.size() && i < groups.size(); ++i) groups[i].set_options(std::move(saved[i].second));
}

}  // namespace ddp::plugins
