// An example out-of-tree plugin: a shared library that a program loads with
// ddp::loadPluginLibrary("build/plugins/libddp_example_plugin.so"). It adds
//   model.linear     a single Linear layer (logistic / linear regression)
//   loss.smooth_l1   Huber-like loss for regression
// Only ddp's headers are needed: the symbols come from the loading program.
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/linear.h>

#include "framework/core/errors.hpp"
#include "framework/experiment/plugin_registry.hpp"

namespace {

class LinearModel : public ddp::Model {
 public:
  LinearModel(int64_t in, int64_t out) { linear_ = register_module("linear", torch::nn::Linear(in, out)); }
  at::Tensor forward(const at::Tensor& input) override { return linear_->forward(input); }

 private:
  torch::nn::Linear linear_{nullptr};
};

ddp::ModelPtr makeLinear(const ddp::Params&, const ddp::ModelContext& context) {
  if (context.numFeatures <= 0) throw ddp::UsageError("model.linear: the dataset's feature count is unknown");
  // Regression (no classes) predicts one value per row.
  return std::make_shared<LinearModel>(context.numFeatures, context.numClasses > 0 ? context.numClasses : 1);
}

ddp::LossFn makeSmoothL1(const ddp::Params& params) {
  const double beta = params.getDouble("beta");
  return [beta](const at::Tensor& output, const at::Tensor& target) {
    at::Tensor prediction = output;
    if (output.dim() == 2 && output.size(1) == 1 && target.dim() == 1) prediction = output.squeeze(1);
    namespace F = torch::nn::functional;
    return F::smooth_l1_loss(prediction, target.to(prediction.scalar_type()), F::SmoothL1LossFuncOptions(), beta);
  };
}

}  // namespace

extern "C" void ddp_register_plugins(ddp::PluginRegistry& registry) {
  {
    ddp::PluginSpec spec;
    spec.kind = ddp::PluginKind::Model;
    spec.name = "linear";
    spec.doc = "one Linear layer, sized from the dataset (example plugin)";
    spec.model = makeLinear;
    registry.add(std::move(spec));
  }
  {
    ddp::PluginSpec spec;
    spec.kind = ddp::PluginKind::Loss;
    spec.name = "smooth_l1";
    spec.doc = "smooth L1 (Huber-like) loss for regression (example plugin)";
    ddp::ParamSpec beta;
    beta.name = "beta";
    beta.type = ddp::ParamType::Float;
    beta.defaultValue = 1.0;
    beta.min = 0;
    beta.minExclusive = true;
    beta.doc = "where the loss turns from quadratic to linear";
    spec.params.push_back(beta);
    spec.loss = makeSmoothL1;
    registry.add(std::move(spec));
  }
}
