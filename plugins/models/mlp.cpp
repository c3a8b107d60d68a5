// The built-in MLP (mlp.hpp), with a fused Linear+activation autograd node.
//
// Each Linear layer and the activation after it are one autograd node
// (LinearActivationBackward) instead of the three or four that composing
// at::linear and the activation records (AddmmBackward, TBackward for the
// weight's transpose, the activation's backward). The autograd engine has a
// fixed cost per node (thread-local state switched in and out, queueing,
// input buffers), which on small layers is most of a backward pass: the wine
// MLP's backward goes from 11 nodes to 8 (7 with the cross_entropy loss's).
// Gradients still become ready layer by layer, so DDP overlaps communication
// with backward as before.
//
// Small layers (at most kSmallLinearMacs multiply-adds per product) run on
// the loops of linear_kernel.hpp, which skip the dispatcher and OpenBLAS's
// per-call overhead and fuse bias, relu and the bias gradient; they agree
// with ATen to float rounding, not bit for bit. Larger layers, other
// devices and dtypes, and backward with create_graph use ATen ops, with
// autograd's own formulas (mm in the same operand order, threshold_backward,
// tanh_backward, ...).
#include "plugins/models/mlp.hpp"

#include <ATen/core/LegacyTypeDispatch.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>

#include "plugins/common.hpp"
#include "framework/experiment/precision.hpp"
#include "plugins/kernels/linear_kernel.hpp"

namespace ddp::plugins {

namespace {

enum class Activation { None, Relu, Tanh, Gelu, Sigmoid };

Activation activationFromName(const std::string& name) {
  if (name == "relu") return Activation::Relu;
  if (name == "tanh") return Activation::Tanh;
  if (name == "gelu") return Activation::Gelu;
  if (name == "sigmoid") return Activation::Sigmoid;
  paramError(kModel, "activation", "unknown activation '{}'; known: relu, tanh, gelu, sigmoid", name);
}

// Whether the small-layer loops of linear_kernel.hpp take y = x W^T + b:
// float or double CPU tensors of one dtype, contiguous, and a product of at
// most kSmallLinearMacs multiply-adds. Anything else goes to ATen.
bool smallLayer(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  const auto type = x.scalar_type();
  if (type != at::kFloat && type != at::kDouble) return false;
  const auto fits = [type](const at::Tensor& t) {
    return t.device().is_cpu() && t.layout() == at::kStrided && t.scalar_type() == type && t.is_contiguous();
  };
  if (x.dim() != 2 || weight.dim() != 2 || !fits(x) || !fits(weight) || x.size(1) != weight.size(1)) return false;
  if (bias.defined() && (bias.dim() != 1 || !fits(bias) || bias.size(0) != weight.size(0))) return false;
  return x.size(0) * weight.size(0) * weight.size(1) <= kSmallLinearMacs;
}

// activation(x W^T + b), computed without recording anything.
at::Tensor linearActivation(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                            Activation activation) {
  at::Tensor z;
  if (smallLayer(x, weight, bias)) {
    z = at::empty({x.size(0), weight.size(0)}, x.options());
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "ddp_linear_forward", [&] {
      linearForward<scalar_t>(x.data_ptr<scalar_t>(), weight.data_ptr<scalar_t>(),
                              bias.defined() ? bias.data_ptr<scalar_t>() : nullptr, z.data_ptr<scalar_t>(), x.size(0),
                              weight.size(1), weight.size(0), /*relu=*/activation == Activation::Relu);
    });
    if (activation == Activation::Relu) return z;
  } else {
    z = bias.defined() ? at::addmm(bias, x, weight.t()) : at::mm(x, weight.t());
  }
  switch (activation) {
    case Activation::None:
      return z;
    case Activation::Relu:
      return at::relu_(z);  // z is ours alone
    case Activation::Tanh:
      return at::tanh_(z);
    case Activation::Sigmoid:
      return at::sigmoid_(z);
    case Activation::Gelu:
      return at::gelu(z);
  }
  return z;
}

// The autograd node of y = activation(x W^T + b), written as LibTorch's
// generated nodes are (a Node subclass with SavedVariables) rather than
// through torch::autograd::Function, whose context object, maps and locks
// cost about as much again per layer. Saves x and W, and y (relu, tanh,
// sigmoid: their derivatives are functions of the output) or the
// pre-activation z (gelu).
struct LinearActivationBackward : torch::autograd::Node {
  Activation activation = Activation::None;
  bool keptIsOutput = false;
  torch::autograd::SavedVariable x, weight, kept;
  torch::autograd::SavedVariable bias;  // gelu only: create_graph recomputes z from it

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    torch::autograd::variable_list out(3);
    at::Tensor g = std::move(grads[0]);
    if (!g.defined()) return out;
    const at::Tensor input = x.unpack();
    const at::Tensor w = weight.unpack();
    const at::Tensor k = activation == Activation::None ? at::Tensor()
                                                        : kept.unpack(keptIsOutput ? shared_from_this() : nullptr);
    // With create_graph (grad mode on) the gradient must be built from
    // recorded ATen ops; otherwise nothing below needs autograd.
    if (at::GradMode::is_enabled()) {
      // The saved z (gelu) was computed unrecorded; its gradient needs the
      // recorded one.
      if (activation == Activation::Gelu) {
        const at::Tensor b = bias.unpack();
        return composed(g, input, w, b.defined() ? at::addmm(b, input, w.t()) : at::mm(input, w.t()));
      }
      return composed(g, input, w, k);
    }
    at::AutoDispatchBelowADInplaceOrView belowAutograd;
    if (!smallLayer(input, w, at::Tensor()) || g.scalar_type() != input.scalar_type() || !g.device().is_cpu() ||
        g.dim() != 2 || g.size(0) != input.size(0) || g.size(1) != w.size(0)) {
      return composed(g, input, w, k);
    }
    if (activation == Activation::Relu && k.is_contiguous() && k.scalar_type() == g.scalar_type()) {
      g = g.contiguous();
      at::Tensor masked = at::empty_like(g);
      AT_DISPATCH_FLOATING_TYPES(g.scalar_type(), "ddp_relu_backward", [&] {
        reluBackward<scalar_t>(g.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(), masked.data_ptr<scalar_t>(), g.numel());
      });
      g = std::move(masked);
    } else {
      g = activationBackward(g, k).contiguous();
    }
    const int64_t n = input.size(0), inWidth = w.size(1), outWidth = w.size(0);
    if (task_should_compute_output(0)) out[0] = at::empty({n, inWidth}, g.options());
    if (task_should_compute_output(1)) out[1] = at::empty({outWidth, inWidth}, g.options());
    if (task_should_compute_output(2)) out[2] = at::empty({outWidth}, g.options());
    AT_DISPATCH_FLOATING_TYPES(g.scalar_type(), "ddp_linear_backward", [&] {
      const auto ptr = [](at::Tensor& t) { return t.defined() ? t.data_ptr<scalar_t>() : nullptr; };
      linearBackward<scalar_t>(g.data_ptr<scalar_t>(), input.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(), ptr(out[1]),
                               ptr(out[2]), ptr(out[0]), n, inWidth, outWidth);
    });
    return out;
  }

  std::string name() const override { return "LinearActivationBackward"; }

  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    x.reset_data();
    weight.reset_data();
    kept.reset_data();
    bias.reset_data();
  }

 private:
  // The activation's derivative, as autograd's formulas have it.
  at::Tensor activationBackward(const at::Tensor& g, const at::Tensor& k) const {
    switch (activation) {
      case Activation::None:
        return g;
      case Activation::Relu:
        return at::threshold_backward(g, k, 0);
      case Activation::Tanh:
        return at::tanh_backward(g, k);
      case Activation::Sigmoid:
        return at::sigmoid_backward(g, k);
      case Activation::Gelu:
        return at::gelu_backward(g, k);
    }
    return g;
  }

  // The gradients from ATen ops: autograd's addmm formulas for
  // addmm(b, x, W.t()): dx = g W, d(W.t()) = (g^T x)^T so dW = g^T x, and db
  // = g summed over the batch.
  torch::autograd::variable_list composed(const at::Tensor& gradOut, const at::Tensor& input, const at::Tensor& w,
                                          const at::Tensor& k) {
    torch::autograd::variable_list out(3);
    const at::Tensor g = activationBackward(gradOut, k);
    if (task_should_compute_output(0)) out[0] = g.mm(w);
    if (task_should_compute_output(1)) out[1] = g.t().mm(input);
    if (task_should_compute_output(2)) out[2] = g.sum(0);
    return out;
  }
};

// activation(x W^T + b), recorded as one LinearActivationBackward node.
at::Tensor linearActivationNode(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                Activation activation) {
  at::Tensor y, z;
  {
    // Nothing below records: the node is set up by hand afterwards.
    at::AutoDispatchBelowADInplaceOrView belowAutograd;
    if (activation == Activation::Gelu) {
      z = linearActivation(x, weight, bias, Activation::None);
      y = at::gelu(z);
    } else {
      y = linearActivation(x, weight, bias, activation);
    }
  }
  std::shared_ptr<LinearActivationBackward> node(new LinearActivationBackward(), torch::autograd::deleteNode);
  node->set_next_edges(torch::autograd::collect_next_edges(x, weight, bias));
  torch::autograd::set_history(y, node);
  node->activation = activation;
  node->x = torch::autograd::SavedVariable(x, /*is_output=*/false);
  node->weight = torch::autograd::SavedVariable(weight, /*is_output=*/false);
  if (activation == Activation::Gelu) {
    node->kept = torch::autograd::SavedVariable(z, /*is_output=*/false);
    node->bias = torch::autograd::SavedVariable(bias, /*is_output=*/false);
  } else if (activation != Activation::None) {
    node->keptIsOutput = true;
    node->kept = torch::autograd::SavedVariable(y, /*is_output=*/true);
  }
  return y;
}

// Linear layers with an activation (and optional dropout) between them. The
// Linear layers are the only submodules, in a ModuleList named "layers", so
// parameter names are layers.0.weight, layers.0.bias, layers.1.weight, ...
// whatever the activation or dropout: checkpoints stay loadable across them.
class Mlp : public Model {
 public:
  Mlp(const std::vector<int64_t>& widths, Activation activation, double dropout)
      : activation_(activation), dropout_(dropout) {
    layers_ = register_module("layers", torch::nn::ModuleList());
    for (size_t i = 0; i + 1 < widths.size(); ++i) {
      torch::nn::Linear linear(widths[i], widths[i + 1]);
      layers_->push_back(linear);
      linears_.push_back(linear);
    }
  }

  std::vector<std::shared_ptr<torch::nn::Module>> shardingUnits() override {
    std::vector<std::shared_ptr<torch::nn::Module>> units;
    for (auto& linear : linears_) units.push_back(linear.ptr());
    return units;
  }

  at::Tensor forward(const at::Tensor& input) override {
    const int64_t inWidth = linears_.front()->options.in_features();
    if (input.dim() != 2 || input.size(1) != inWidth) {
      fail<UsageError>("mlp: expected input [batch, {}], got {}", inWidth, c10::str(input.sizes()));
    }
    // The fused node where something needs a gradient; without one (eval,
    // no_grad) the same arithmetic runs with nothing recorded.
    const bool record = at::GradMode::is_enabled();
    at::Tensor x = input;
    for (size_t i = 0; i < linears_.size(); ++i) {
      const bool last = i + 1 == linears_.size();
      const Activation activation = last ? Activation::None : activation_;
      const auto& linear = linears_[i];
      // Each layer is a unit (sharding_units.hpp).
      x = runUnit(i, [&] {
        // training.precision bf16: ATen's ops, which autocast runs in
        // bfloat16; the fused loops here are fp32 and fp64 only.
        if (autocastActive(x.device().type())) {
          const at::Tensor z = at::linear(x, linear->weight, linear->bias);
          switch (activation) {
            case Activation::None: return z;
            case Activation::Relu: return at::relu(z);
            case Activation::Tanh: return at::tanh(z);
            case Activation::Sigmoid: return at::sigmoid(z);
            case Activation::Gelu: return at::gelu(z);
          }
          return z;
        }
        const bool needsGrad = record && (x.requires_grad() || linear->weight.requires_grad() ||
                                          (linear->bias.defined() && linear->bias.requires_grad()));
        if (needsGrad) return linearActivationNode(x, linear->weight, linear->bias, activation);
        at::AutoDispatchBelowADInplaceOrView belowAutograd;
        return linearActivation(x, linear->weight, linear->bias, activation);
      });
      if (last) break;
      if (dropout_ > 0 && is_training()) x = torch::dropout(x, dropout_, /*train=*/true);
    }
    return x;
  }

 private:
  Activation activation_;
  double dropout_;
  torch::nn::ModuleList layers_{nullptr};
  std::vector<torch::nn::Linear> linears_;  // the same modules, typed, for forward()
};

// Fills the 0s ("take from the dataset") and checks the rest against it.
std::vector<int64_t> resolveWidths(std::vector<int64_t> widths, const ModelContext& context) {
  if (widths.size() < 2) {
    paramError(kModel, "layers", "needs at least an input and an output width, e.g. [0, 64, 0]");
  }
  int64_t& first = widths.front();
  int64_t& last = widths.back();
  if (first == 0) {
    if (context.numFeatures <= 0)
      paramError(kModel, "layers", "first width is 0 but the dataset's feature count is unknown");
    first = context.numFeatures;
  } else if (context.numFeatures > 0 && first != context.numFeatures) {
    paramError(kModel, "layers",
               "first width {} does not match the dataset's {} features. HINT: use 0 to take it from the dataset",
               first, context.numFeatures);
  }
  if (last == 0) {
    // Regression (no classes) predicts one value per row.
    last = context.numClasses > 0 ? context.numClasses : 1;
  } else if (context.numClasses > 0 && last != context.numClasses) {
    paramError(kModel, "layers",
               "last width {} does not match the dataset's {} classes. HINT: use 0 to take it from the dataset", last,
               context.numClasses);
  }
  for (size_t i = 0; i < widths.size(); ++i) {
    if (widths[i] < 1) {
      paramError(kModel, "layers", "width {} at position {} must be >= 1 (0 is allowed only first or last)",
                 widths[i], i);
    }
  }
  return widths;
}

}  // namespace

ModelPtr makeMlp(const Params& params, const ModelContext& context) {
  auto widths = resolveWidths(params.getIntList("layers"), context);
  const double dropout = params.getDouble("dropout");
  requireBelow(kModel, "dropout", dropout, 1.0);
  return std::make_shared<Mlp>(widths, activationFromName(params.getString("activation")), dropout);
}

}  // namespace ddp::plugins
