// Losses: mean over the batch, as the trainer averages gradients across ranks.
//
// cross_entropy without label smoothing is one autograd node
// (CrossEntropyBackward) rather than the two that at::cross_entropy_loss
// records (LogSoftmaxBackward, NllLossBackward): the engine's cost per node
// is most of a small model's backward. Forward and backward call the same
// ATen functions as those two nodes, so values and gradients are identical.
#include <ATen/core/LegacyTypeDispatch.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <optional>
#include <tuple>

#include "plugins/common.hpp"

namespace ddp::plugins {

namespace {

constexpr int64_t kIgnoreIndex = -100;  // PyTorch's default: such targets add nothing

// The autograd node of the mean softmax cross-entropy of logits [N, C]
// against class indices [N], as LibTorch's generated nodes are written.
struct CrossEntropyBackward : torch::autograd::Node {
  torch::autograd::SavedVariable logits, logProbs, target, totalWeight;

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    torch::autograd::variable_list out(1);
    if (!grads[0].defined() || !task_should_compute_output(0)) return out;
    std::optional<at::AutoDispatchBelowADInplaceOrView> belowAutograd;
    at::Tensor lp;
    if (at::GradMode::is_enabled()) {
      // create_graph: the gradient must itself be differentiable in the
      // logits, so the log-probabilities are recomputed as a recorded op.
      lp = at::_log_softmax(logits.unpack(), 1, /*half_to_float=*/false);
    } else {
      belowAutograd.emplace();
      lp = logProbs.unpack();
    }
    // NllLossBackward's, then LogSoftmaxBackward's formula.
    at::Tensor gradLogProbs = at::nll_loss_backward(grads[0], lp, target.unpack(), /*weight=*/{}, at::Reduction::Mean,
                                                    kIgnoreIndex, totalWeight.unpack());
    out[0] = at::_log_softmax_backward_data(gradLogProbs, lp, 1, lp.scalar_type());
    return out;
  }

  std::string name() const override { return "CrossEntropyBackward"; }

  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    logits.reset_data();
    logProbs.reset_data();
    target.reset_data();
    totalWeight.reset_data();
  }
};

// at::cross_entropy_loss(logits, target) (mean, no weights, no smoothing),
// recorded as one CrossEntropyBackward node.
at::Tensor crossEntropyNode(const at::Tensor& logits, const at::Tensor& target) {
  at::Tensor logProbs, loss, totalWeight;
  {
    at::AutoDispatchBelowADInplaceOrView belowAutograd;  // the node is set up by hand below
    logProbs = at::_log_softmax(logits, 1, /*half_to_float=*/false);
    std::tie(loss, totalWeight) =
        at::nll_loss_forward(logProbs, target, /*weight=*/{}, at::Reduction::Mean, kIgnoreIndex);
  }
  std::shared_ptr<CrossEntropyBackward> node(new CrossEntropyBackward(), torch::autograd::deleteNode);
  node->set_next_edges(torch::autograd::collect_next_edges(logits));
  torch::autograd::set_history(loss, node);
  node->logits = torch::autograd::SavedVariable(logits, /*is_output=*/false);
  node->logProbs = torch::autograd::SavedVariable(logProbs, /*is_output=*/false);
  node->target = torch::autograd::SavedVariable(target, /*is_output=*/false);
  node->totalWeight = torch::autograd::SavedVariable(totalWeight, /*is_output=*/false);
  return loss;
}

LossFn makeCrossEntropy(const Params& params) {
  const double labelSmoothing = params.getDouble("label_smoothing");
  requireBelow(kLoss, "label_smoothing", labelSmoothing, 1.0);
  return [labelSmoothing](const at::Tensor& rawOutput, const at::Tensor& rawTarget) {
    // A language model's logits [B, T, V] against next tokens [B, T]: the
    // mean over all B*T tokens, as [B*T, V] against [B*T].
    const bool perToken = rawOutput.dim() == 3 && rawTarget.dim() == 2 &&
                          rawOutput.size(0) == rawTarget.size(0) && rawOutput.size(1) == rawTarget.size(1);
    const at::Tensor output = perToken ? rawOutput.reshape({-1, rawOutput.size(2)}) : rawOutput;
    const at::Tensor target = perToken ? rawTarget.reshape({-1}) : rawTarget;
    if (output.dim() != 2 || target.dim() != 1 || target.size(0) != output.size(0)) {
      fail<UsageError>(
          "loss cross_entropy: expected output [N, C] and class indices [N] (or [B, T, V] and [B, T] tokens), got {} "
          "and {}. HINT: use the mse loss for regression",
          c10::str(rawOutput.sizes()), c10::str(rawTarget.sizes()));
    }
    if (target.scalar_type() != at::kLong) {
      fail<UsageError>(
          "loss cross_entropy: expected class indices (int64), got {} targets {}: a regression dataset? HINT: use the "
          "mse loss for regression",
          c10::toString(target.scalar_type()), c10::str(target.sizes()));
    }
    if (labelSmoothing == 0 && at::GradMode::is_enabled() && output.requires_grad() &&
        at::isFloatingType(output.scalar_type()) && target.scalar_type() == at::kLong) {
      return crossEntropyNode(output, target);
    }
    return torch::cross_entropy_loss(output, target, /*weight=*/{}, at::Reduction::Mean, kIgnoreIndex,
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
        fail<UsageError>("loss mse: integer targets need outputs [N, C], got {}", c10::str(output.sizes()));
      }
      wanted = torch::one_hot(target, output.size(1)).to(output.scalar_type());
    } else if (output.dim() == 2 && output.size(1) == 1 && target.dim() == 1) {
      // One output per row against [N] targets: a regression model's usual shape.
      prediction = output.squeeze(1);
    }
    if (prediction.sizes() != wanted.sizes()) {
      fail<UsageError>("loss mse: output {} and target {} do not match", c10::str(output.sizes()),
                       c10::str(target.sizes()));
    }
    return torch::mse_loss(prediction, wanted.to(prediction.scalar_type()));
  };
}

}  // namespace

void registerLosses(PluginRegistry& registry) {
  registry.add({"cross_entropy",
                "softmax cross-entropy against class indices; [B, T, V] logits against [B, T] tokens: mean per token",
                {
                    Param("label_smoothing", ParamType::Float, 0.0,
                          "mix of the uniform distribution into the targets")
                        .atLeast(0)
                        .below(1),
                },
                makeCrossEntropy});
  registry.add({"mse", "mean squared error (integer targets are compared as one-hot vectors)", {}, makeMse});
}

}  // namespace ddp::plugins
