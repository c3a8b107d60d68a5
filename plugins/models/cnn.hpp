// The built-in convolutional network ("model.cnn"): blocks of convolution,
// optional batch norm, activation and pooling, then a linear head. Written
// with plain torch::nn modules, as a template to copy.
//
// Contract
// - Input [batch, C, H, W] float images, where the dataset's sample shape is
//   [C, H, W] (e.g. digits: [1, 8, 8]); a sample shape [H, W] means one
//   channel, and the input [batch, H, W] is viewed as [batch, 1, H, W].
//   Output [batch, classes]: logits for cross_entropy. Another input shape
//   is a UsageError naming the expected one.
// - Block i (one per entry of "channels"): Conv2d(c_in, channels[i],
//   kernel_size, stride 1, "same" padding kernel_size / 2, so the map keeps
//   its size; kernel_size is odd), then BatchNorm2d when "batch_norm" (the
//   convolution then has no bias, which batch norm would cancel), then the
//   activation (relu, gelu, tanh), then "pool" (max or avg, 2x2, stride 2,
//   halving H and W rounded down; none). Pooling is skipped once the map is
//   1x1; a map with one side 1 and the other larger cannot be pooled 2x2
//   and is a UsageError.
// - Head: flatten (channels.back() * H' * W' features), dropout ("dropout",
//   in training mode only), then Linear to the classes; with "hidden" > 0,
//   Linear(features, hidden), the activation, Linear(hidden, classes).
// - Parameter count: sum over blocks of c_in * c_out * k * k (+ c_out conv
//   bias without batch norm, + 2 * c_out batch norm weight and bias with
//   it), plus the head's Linear weights and biases. Batch norm adds buffers
//   running_mean, running_var (c_out floats each) and num_batches_tracked;
//   under DDP every rank ends a step with rank 0's.
// - Names: blocks.<i>.conv.{weight,bias}, blocks.<i>.bn.{weight,bias,
//   running_mean,running_var,num_batches_tracked}, hidden.{weight,bias},
//   head.{weight,bias}.
// - Errors (UsageError, one line, with a HINT): a dataset without an image
//   sample shape ([C, H, W] or [H, W]; a table has [F]), a regression
//   dataset (no classes), an even kernel_size, a map that pooling would
//   make empty.
// - Weights start from torch::nn's default initialisation, drawn from the
//   global torch generator (training.seed), so every rank builds the same
//   model.
#pragma once

#include "framework/experiment/plugin_registry.hpp"

namespace ddp::plugins {

ModelPtr makeCnn(const Params& params, const ModelContext& context);

}  // namespace ddp::plugins
