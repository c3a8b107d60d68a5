// An example out-of-tree plugin, and the template to copy for one of your
// own: a shared library that a program loads with
// ddp::loadPluginLibrary("build/plugins/libddp_example_plugin.so"), or that
// an experiment names in its "plugins" list. It adds
//   model.plain_mlp  a plain torch::nn MLP: the model template to copy
//   model.linear     a single Linear layer (logistic / linear regression)
//   loss.smooth_l1   Huber-like loss for regression
//   comm_hook.sum_then_divide  the exact average in two steps: the template
//                    for a communication hook (distributed.comm_hook)
// Only ddp's headers are needed: the symbols come from the loading program.
//
// A plugin library
//   - exports its plugin API version, once: DDP_EXPORT_PLUGIN_API_VERSION();
//     (a library built against other ddp headers is then refused when loaded
//     rather than misread),
//   - exports extern "C" void ddp_register_plugins(ddp::PluginRegistry&),
//     which adds one PluginSpec per plugin: name, one-line doc, parameters
//     (declared with ddp::Param), and the factory, whose type says the kind.
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>

#include "framework/core/errors.hpp"
#include "framework/experiment/param.hpp"
#include "framework/experiment/plugin_registry.hpp"

DDP_EXPORT_PLUGIN_API_VERSION();

namespace {

using ddp::Param;
using ddp::ParamType;

// ---- model.plain_mlp: the template for a model ---------------------------------
// A model is a torch::nn::Module with one tensor in and one out. Everything
// with parameters must be registered (register_module / register_parameter):
// DDP averages the gradients of exactly those, and checkpoints save them.
class PlainMlp : public ddp::Model {
 public:
  // in: values per sample; hidden: the widths between; out: values per prediction.
  PlainMlp(int64_t in, const std::vector<int64_t>& hidden, int64_t out) {
    layers_ = register_module("layers", torch::nn::ModuleList());
    int64_t width = in;
    for (int64_t next : hidden) {
      layers_->push_back(torch::nn::Linear(width, next));
      width = next;
    }
    layers_->push_back(torch::nn::Linear(width, out));
  }

  // input: [batch, *sampleShape]; flattened, so that images or other shaped
  // samples work too. Returns [batch, out]: logits for classification.
  at::Tensor forward(const at::Tensor& input) override {
    at::Tensor x = input.flatten(1);
    for (size_t i = 0; i < layers_->size(); ++i) {
      x = layers_[i]->as<torch::nn::Linear>()->forward(x);
      if (i + 1 < layers_->size()) x = torch::relu(x);  // between the layers, not after the last
    }
    return x;
  }

 private:
  torch::nn::ModuleList layers_{nullptr};
};

// The factory: the validated parameters (declared in ddp_register_plugins
// below) and the dataset's shape (ModelContext) in, the model out.
ddp::ModelPtr makePlainMlp(const ddp::Params& params, const ddp::ModelContext& context) {
  if (context.numFeatures <= 0) {
    ddp::fail<ddp::UsageError>("model.plain_mlp: the dataset's feature count is unknown");
  }
  // Regression (no classes) predicts one value per row.
  const int64_t out = context.numClasses > 0 ? context.numClasses : 1;
  return std::make_shared<PlainMlp>(context.numFeatures, params.getIntList("hidden"), out);
}

// ---- model.linear ----------------------------------------------------------------

class LinearModel : public ddp::Model {
 public:
  LinearModel(int64_t in, int64_t out) { linear_ = register_module("linear", torch::nn::Linear(in, out)); }
  at::Tensor forward(const at::Tensor& input) override { return linear_->forward(input.flatten(1)); }

 private:
  torch::nn::Linear linear_{nullptr};
};

ddp::ModelPtr makeLinear(const ddp::Params&, const ddp::ModelContext& context) {
  if (context.numFeatures <= 0) ddp::fail<ddp::UsageError>("model.linear: the dataset's feature count is unknown");
  return std::make_shared<LinearModel>(context.numFeatures, context.numClasses > 0 ? context.numClasses : 1);
}

// ---- loss.smooth_l1 --------------------------------------------------------------

ddp::LossFn makeSmoothL1(const ddp::Params& params) {
  const double beta = params.getDouble("beta");
  return [beta](const at::Tensor& output, const at::Tensor& target) {
    at::Tensor prediction = output;
    if (output.dim() == 2 && output.size(1) == 1 && target.dim() == 1) prediction = output.squeeze(1);
    namespace F = torch::nn::functional;
    return F::smooth_l1_loss(prediction, target.to(prediction.scalar_type()), F::SmoothL1LossFuncOptions(), beta);
  };
}

// ---- comm_hook.sum_then_divide: the template for a communication hook -------------
// A hook gets each gradient bucket as it becomes ready and returns the Work
// of what it started; when that Work completes, the bucket must hold the
// averaged gradient (framework/parallel/comm_hook.hpp). It must not wait
// for its own Work: thenWork() runs a step after the collective instead.

class SumThenDivide : public ddp::CommHook {
 public:
  explicit SumThenDivide(ddp::Milliseconds timeout) : timeout_(timeout) {}
  ddp::WorkPtr run(ddp::ProcessGroup& group, ddp::GradBucket& bucket) override {
    ddp::AllreduceOptions opts;
    opts.op = ddp::ReduceOp::Sum;
    opts.timeout = timeout_;
    ddp::WorkPtr sum = group.allreduce(bucket.buffer, opts);
    at::Tensor buffer = bucket.buffer;  // the tensor, not the reference: the callback runs later
    const double world = group.size();
    return ddp::thenWork(sum, timeout_, [buffer, world]() mutable { buffer.div_(world); });
  }

 private:
  ddp::Milliseconds timeout_;
};

}  // namespace

extern "C" void ddp_register_plugins(ddp::PluginRegistry& registry) {
  registry.add({"plain_mlp",
                "a plain torch::nn MLP with ReLU, sized from the dataset (example plugin; the template to copy)",
                {Param("hidden", ParamType::IntList, std::vector<int64_t>{64}, "hidden widths, input to output")
                     .atLeast(1)},
                makePlainMlp});
  registry.add({"linear", "one Linear layer, sized from the dataset (example plugin)", {}, makeLinear});
  registry.add({"smooth_l1",
                "smooth L1 (Huber-like) loss for regression (example plugin)",
                {Param("beta", ParamType::Float, 1.0, "where the loss turns from quadratic to linear").above(0)},
                makeSmoothL1});
  registry.add({"sum_then_divide", "allreduce with Sum, then divide by the world size (example plugin)", {},
                ddp::CommHookFactory([](const ddp::Params&, ddp::Milliseconds timeout) -> ddp::CommHookPtr {
                  return std::make_shared<SumThenDivide>(timeout);
                })});
}
