// The built-in multi-layer perceptron ("model.mlp"): Linear layers with an
// activation (relu, tanh, gelu, sigmoid) and optional dropout between them.
//
// Contract
// - Parameters: "layers" (widths input, hidden..., output; a first or last
//   0 takes the dataset's feature or class count), "activation", "dropout"
//   in [0, 1). A width that contradicts the dataset is a UsageError with a
//   HINT.
// - Input [batch, features], output [batch, classes] (1 for regression).
// - Parameter names are layers.0.weight, layers.0.bias, layers.1.weight, ...
//   whatever the activation or dropout, so checkpoints stay loadable.
// - Each layer with its activation is one autograd node, small layers on
//   the fused loops of plugins/kernels/linear_kernel.hpp; results agree with
//   torch::nn::Linear to float rounding (see the plain template model in
//   plugins/example/example_plugin.cpp).
#pragma once

#include "framework/experiment/plugin_registry.hpp"

namespace ddp::plugins {

ModelPtr makeMlp(const Params& params, const ModelContext& context);

}  // namespace ddp::plugins
