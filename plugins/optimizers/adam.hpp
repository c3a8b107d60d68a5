// The built-in Adam and AdamW ("optimizer.adam", "optimizer.adamw"): the
// formulas of torch.optim.Adam / AdamW, each float32/float64 contiguous CPU
// parameter updated in one fused pass (plugins/kernels/adam_kernel.hpp),
// any other parameter with the same formulas as tensor operations.
//
// Contract
// - Parameters: lr > 0, beta1 and beta2 in [0, 1), eps >= 0, weight_decay
//   >= 0 (Adam: an L2 term in the gradient; AdamW: decoupled decay).
// - Options and state are LibTorch's own types (AdamOptions,
//   AdamParamState, ...): get_lr()/set_lr() work through param_groups(),
//   save() writes torch::optim::Adam's archive layout, and load() also
//   restores the groups' options (group_options.hpp).
#pragma once

#include <memory>
#include <vector>

#include "framework/experiment/plugin_registry.hpp"

namespace ddp::plugins {

std::unique_ptr<torch::optim::Optimizer> makeAdam(std::vector<at::Tensor> parameters, const Params& params);
std::unique_ptr<torch::optim::Optimizer> makeAdamW(std::vector<at::Tensor> parameters, const Params& params);

}  // namespace ddp::plugins
