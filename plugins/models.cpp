// Models: a multi-layer perceptron.
#include <torch/torch.h>

#include "plugins/builtin.hpp"

namespace ddp::plugins {

namespace {

constexpr PluginKind kModel = PluginKind::Model;

enum class Activation { Relu, Tanh, Gelu, Sigmoid };

Activation activationFromName(const std::string& name) {
  if (name == "relu") return Activation::Relu;
  if (name == "tanh") return Activation::Tanh;
  if (name == "gelu") return Activation::Gelu;
  if (name == "sigmoid") return Activation::Sigmoid;
  paramError(kModel, "activation", "unknown activation '" + name + "'; known: relu, tanh, gelu, sigmoid");
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

  at::Tensor forward(const at::Tensor& input) override {
    const int64_t inWidth = linears_.front()->options.in_features();
    if (input.dim() != 2 || input.size(1) != inWidth) {
      throw UsageError("mlp: expected input [batch, " + std::to_string(inWidth) + "], got " + c10::str(input.sizes()));
    }
    at::Tensor x = input;
    for (size_t i = 0; i < linears_.size(); ++i) {
      x = linears_[i]->forward(x);
      if (i + 1 == linears_.size()) break;
      x = activate(x);
      if (dropout_ > 0 && is_training()) x = torch::dropout(x, dropout_, /*train=*/true);
    }
    return x;
  }

 private:
  at::Tensor activate(const at::Tensor& x) const {
    switch (activation_) {
      case Activation::Relu:
        return torch::relu(x);
      case Activation::Tanh:
        return torch::tanh(x);
      case Activation::Gelu:
        return torch::gelu(x);
      case Activation::Sigmoid:
        return torch::sigmoid(x);
    }
    return x;
  }

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
               "first width " + std::to_string(first) + " does not match the dataset's " +
                   std::to_string(context.numFeatures) + " features. HINT: use 0 to take it from the dataset");
  }
  if (last == 0) {
    // Regression (no classes) predicts one value per row.
    last = context.numClasses > 0 ? context.numClasses : 1;
  } else if (context.numClasses > 0 && last != context.numClasses) {
    paramError(kModel, "layers",
               "last width " + std::to_string(last) + " does not match the dataset's " +
                   std::to_string(context.numClasses) + " classes. HINT: use 0 to take it from the dataset");
  }
  for (size_t i = 0; i < widths.size(); ++i) {
    if (widths[i] < 1) {
      paramError(kModel, "layers",
                 "width " + std::to_string(widths[i]) + " at position " + std::to_string(i) +
                     " must be >= 1 (0 is allowed only first or last)");
    }
  }
  return widths;
}

ModelPtr makeMlp(const Params& params, const ModelContext& context) {
  auto widths = resolveWidths(params.getIntList("layers"), context);
  const double dropout = params.getDouble("dropout");
  requireBelow(kModel, "dropout", dropout, 1.0);
  return std::make_shared<Mlp>(widths, activationFromName(params.getString("activation")), dropout);
}

}  // namespace

void registerModels(PluginRegistry& registry) {
  PluginSpec spec;
  spec.kind = kModel;
  spec.name = "mlp";
  spec.doc = "multi-layer perceptron: Linear layers with an activation between them";
  spec.params = {
      Param("layers", ParamType::IntList, std::vector<int64_t>{13, 64, 3},
            "widths: input, hidden..., output; a first or last 0 takes it from the dataset")
          .atLeast(0),
      Param("activation", ParamType::String, "relu", "between the layers").oneOf({"relu", "tanh", "gelu", "sigmoid"}),
      Param("dropout", ParamType::Float, 0.0, "drop probability after each hidden activation, < 1")
          .atLeast(0)
          .atMost(1),
  };
  spec.model = makeMlp;
  registry.add(std::move(spec));
}

}  // namespace ddp::plugins
