// Losses: mean over the batch, as the trainer averages gradients across ranks.
#include <torch/torch.h>

#include "plugins/builtin.hpp"

namespace ddp::plugins {

namespace {

constexpr PluginKind kLoss = PluginKind::Loss;

LossFn makeCrossEntropy(const Params& params) {
  const double labelSmoothing = params.getDouble("label_smoothing");
  requireBelow(kLoss, "label_smoothing", labelSmoothing, 1.0);
  return [labelSmoothing](const at::Tensor& output, const at::Tensor& target) {
    if (output.dim() != 2 || target.dim() != 1 || target.size(0) != output.size(0)) {
      throw UsageError("loss cross_entropy: expected output [N, C] and class indices [N], got " +
                       c10::str(output.sizes()) + " and " + c10::str(target.sizes()) +
                       ". HINT: use the mse loss for regression");
    }
    return torch::cross_entropy_loss(output, target, /*weight=*/{}, at::Reduction::Mean, /*ignore_index=*/-100,
                                     labelSmoothing);
  };
}

LossFn makeMse(const Params&) {
  return [](const at::Tensor& output, const at::Tensor& target) {
    at::Tensor prediction = output;
    at::Tensor wanted = target;
    if (!at::isFloatingType(target.scalar_type())) {
      // Class indices against [N, C] outputs: regress onto one-hot vectors.
      if (output.dim() != 2 || target.dim() != 1) {
        throw UsageError("loss mse: integer targets need outputs [N, C], got " + c10::str(output.sizes()));
      }
      wanted = torch::one_hot(target, output.size(1)).to(output.scalar_type());
    } else if (output.dim() == 2 && output.size(1) == 1 && target.dim() == 1) {
      // One output per row against [N] targets: a regression model's usual shape.
      prediction = output.squeeze(1);
    }
    if (prediction.sizes() != wanted.sizes()) {
      throw UsageError("loss mse: output " + c10::str(output.sizes()) + " and target " + c10::str(target.sizes()) +
                       " do not match");
    }
    return torch::mse_loss(prediction, wanted.to(prediction.scalar_type()));
  };
}

}  // namespace

void registerLosses(PluginRegistry& registry) {
  {
    PluginSpec spec;
    spec.kind = kLoss;
    spec.name = "cross_entropy";
    spec.doc = "softmax cross-entropy against class indices";
    spec.params = {
        Param("label_smoothing", ParamType::Float, 0.0, "mix of the uniform distribution into the targets, < 1")
            .atLeast(0)
            .atMost(1),
    };
    spec.loss = makeCrossEntropy;
    registry.add(std::move(spec));
  }
  {
    PluginSpec spec;
    spec.kind = kLoss;
    spec.name = "mse";
    spec.doc = "mean squared error (integer targets are compared as one-hot vectors)";
    spec.loss = makeMse;
    registry.add(std::move(spec));
  }
}

}  // namespace ddp::plugins
