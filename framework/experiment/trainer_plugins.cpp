// The Trainer's plugins (trainer.hpp): built from the experiment, each error naming its
// plugin, and checked to fit together before a run folder exists.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <cstdlib>

#include "framework/core/errors.hpp"
#include "framework/experiment/callbacks/monitor.hpp"
#include "framework/experiment/trained_model.hpp"
#include "framework/experiment/trainer_impl.hpp"

namespace ddp {
namespace {

// A plugin's factory run with its errors made one line that names it:
// running out of memory (std::bad_alloc, LibTorch's "can't allocate") is
// the experiment's size, a UsageError; any other LibTorch error loses its
// backtrace. UsageErrors pass as they are.
template <typename Make>
auto building(const char* kind, const std::string& name, Make&& make) -> decltype(make()) {
  try {
    return make();
  } catch (const UsageError&) {
    throw;
  } catch (const std::bad_alloc&) {
    fail<UsageError>("{} {}: out of memory while building it. HINT: a smaller {} (or a machine with more memory)", kind,
                     name, kind);
  } catch (const c10::Error& e) {
    const std::string what = errorLine(e);
    if (what.find("can't allocate") != std::string::npos || what.find("out of memory") != std::string::npos) {
      std::string size;
      if (const auto tried = what.find("tried to allocate "); tried != std::string::npos) {
        const double bytes = std::strtod(what.c_str() + tried + 18, nullptr);
        if (bytes > 0) size = fmt::format(" ({:.4g} GiB asked for)", bytes / double(1 << 30));
      }
      fail<UsageError>("{} {}: out of memory while building it{}. HINT: a smaller {} (or a machine with more memory)",
                       kind, name, size, kind);
    }
    fail<std::runtime_error>("{} {}: {}", kind, name, what);
  }
}


std::string shapeOf(const at::Tensor& t) {
  return fmt::format("{} {}", c10::str(t.sizes()), c10::toString(t.scalar_type()));
}

// Before the run folder exists: the model's forward and the loss on the
// first two training rows, without gradients, so that a dataset, model and
// loss that do not fit together (a regression dataset with cross_entropy,
// an output width that is not the target's) fail here, as one line naming
// the three with the shapes, not in the first step with a folder left
// behind. It runs once; eval mode, so that it draws no random numbers.
void checkPluginsFit(const ExperimentConfig& config, const DatasetSplits& data, Model& model, const LossFn& lossFn,
                     const torch::Device& device) {
  if (data.train->size() == 0) return;
  const Batch first = data.train->range(0, 2);
  const at::Tensor x = first.inputs.to(device);
  const at::Tensor y = first.targets.to(device);
  const std::string task = data.task == Task::Regression
                               ? std::string("regression")
                               : fmt::format("{}, {} classes", taskName(data.task), data.numClasses);
  torch::NoGradGuard noGrad;
  const bool training = model.is_training();
  model.eval();
  at::Tensor out;
  std::string where = fmt::format("dataset {} ({}; features {}, targets {}) -> model {}", config.dataset.name, task,
                                  shapeOf(x), shapeOf(y), config.model.name);
  try {
    {
      const ComputePrecision precision(parsePrecision(config.training.precision), device.type());
      out = lossInput(model.forward(x));
    }
    where += fmt::format(" (output {}) -> loss {}", shapeOf(out), config.loss.name);
    (void)lossFn(out, y);
  } catch (const std::exception& e) {
    std::string hint;
    if (data.numClasses == 0 && config.loss.name == "cross_entropy") {
      hint = " HINT: a regression dataset needs a regression loss (\"loss\": {\"name\": \"mse\"}), or set the "
             "dataset's \"task\": \"classification\"";
    } else if (out.defined() && data.numClasses == 0 && out.dim() == 2 && out.size(1) != 1) {
      hint = " HINT: a regression model has one output; make the last width of model.layers 1 (or 0: taken from the "
             "dataset)";
    }
    std::string what = errorLine(e);
    if (hint.empty() || what.find("HINT:") != std::string::npos) {
      fail<UsageError>("{} do not fit together: {}", where, what);
    }
    fail<UsageError>("{} do not fit together: {}.{}", where, what, hint);
  }
  model.train(training);
}

}  // namespace

namespace trainer_detail {

BuiltPlugins buildPlugins(const ExperimentConfig& config, PluginRegistry& registry, const torch::Device& device,
                          bool checkFit) {
  BuiltPlugins b;
  torch::manual_seed(config.training.seed);
  DatasetContext dctx{config.training.seed, config.configDir};
  b.data = building("dataset", config.dataset.name, [&] {
    return registry.get(PluginKind::Dataset, config.dataset.name).dataset(config.dataset.params, dctx);
  });
  const ModelContext modelContext = modelContextFor(b.data);
  b.model = building("model", config.model.name, [&] {
    return registry.get(PluginKind::Model, config.model.name).model(config.model.params, modelContext);
  });
  // So the trained model can be rebuilt without its data (trained_model.hpp).
  b.data.runFiles["model_context.json"] = modelContextJson(modelContext, b.data.task);
  if (!b.data.train || !b.data.test) {
    fail<std::runtime_error>("dataset {}: its factory returned no train or no test split", config.dataset.name);
  }
  // A policy following a metric this dataset never records would wait forever.
  const auto& tc = config.training;
  if (tc.earlyStopping) {
    checkMonitor("training.early_stopping.monitor", tc.earlyStopping->monitor, b.data.task, b.data.test->size());
  }
  if (tc.keepBest > 0) checkMonitor("training.keep_best_by", tc.keepBestMonitor, b.data.task, b.data.test->size());
  if (device.is_cuda()) b.model->to(device);
  b.optimizer = building("optimizer", config.optimizer.name, [&] {
    return registry.get(PluginKind::Optimizer, config.optimizer.name)
        .optimizer(b.model->parameters(), config.optimizer.params);
  });
  if (config.scheduler) {
    b.scheduler = building("scheduler", config.scheduler->name, [&] {
      return registry.get(PluginKind::Scheduler, config.scheduler->name).scheduler(config.scheduler->params);
    });
  }
  b.lossFn = building("loss", config.loss.name,
                      [&] { return registry.get(PluginKind::Loss, config.loss.name).loss(config.loss.params); });
  if (checkFit) checkPluginsFit(config, b.data, *b.model, b.lossFn, device);
  return b;
}
}  // namespace trainer_detail

void checkExperimentBuilds(const ExperimentConfig& config, PluginRegistry& registry) {
  // A model meant for GPUs may have CUDA-only code: the ranks check it there.
  trainer_detail::buildPlugins(config, registry, torch::Device(torch::kCPU), /*checkFit=*/config.distributed.device == "cpu");
}

}  // namespace ddp
