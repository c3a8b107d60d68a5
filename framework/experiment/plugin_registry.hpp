// PluginRegistry: the datasets, models, optimizers, lr schedulers, losses
// and communication hooks that an experiment JSON can name.
//
// Contract
// - Each plugin (PluginSpec) has a unique name within its kind, a one-line
//   doc, its parameters (param.hpp: name, type, default, range or choices,
//   doc) and one factory. The factory's type is the plugin's kind: PluginSpec
//   holds a std::variant of the five factory types, so a spec cannot have
//   two kinds or none. Experiment validation checks a config section against
//   the declared parameters, so a factory receives only well-typed values,
//   with defaults filled in.
// - Registration is explicit: ddp::registerBuiltinPlugins() (plugins/builtin.hpp)
//   for the ones shipped in plugins/, and `ddp_register_plugins(ddp::PluginRegistry&)` exported
//   with C linkage by an out-of-tree shared library (see loadPluginLibrary),
//   which also exports its plugin API version with DDP_EXPORT_PLUGIN_API_VERSION().
//   A name registered twice within a kind is a UsageError.
// - Unknown names fail with UsageError listing the known ones (and the
//   closest, as "did you mean").
// - Datasets describe one sample's shape (DatasetSplits::sampleShape) and,
//   for token data, the vocabulary; models get both in ModelContext, so a
//   CNN or a language model sizes itself from the data.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "framework/data/dataset.hpp"
#include "framework/experiment/param.hpp"
#include "framework/parallel/comm_hook.hpp"
#include "framework/parallel/sharding_units.hpp"

// The version of the plugin interface below (PluginSpec, the factories and
// what they produce, PluginRegistry). A plugin library built against other
// headers is refused by loadPluginLibrary; it is raised whenever a change
// here would break a compiled plugin. 3: Model is also ShardingUnits.
// 4: communication hooks (PluginKind::CommHook). 5: ParamSpec::maxExclusive
// (Param::below).
#define DDP_PLUGIN_API_VERSION 5

// Written once, at namespace scope, in a plugin library's source:
//   DDP_EXPORT_PLUGIN_API_VERSION();
// exports extern "C" int ddp_plugin_api_version(), returning the
// DDP_PLUGIN_API_VERSION of the headers the library was compiled against.
#define DDP_EXPORT_PLUGIN_API_VERSION()                                                 \
  extern "C" __attribute__((visibility("default"))) int ddp_plugin_api_version() { \
    return DDP_PLUGIN_API_VERSION;                                                  \
  }                                                                                 \
  static_assert(true, "")

namespace ddp {

enum class PluginKind { Dataset, Model, Optimizer, Scheduler, Loss, CommHook };
const char* pluginKindName(PluginKind kind);  // "dataset", "model", ...
std::optional<PluginKind> pluginKindFromName(const std::string& name);

// ---- what each kind of plugin produces -----------------------------------------

// What a model learns to do, which decides the metrics of an evaluation:
// accuracy (classification), RMSE (regression), loss per token, perplexity
// and accuracy per token (next-token prediction).
enum class Task { Classification, Regression, NextToken };
const char* taskName(Task task);  // "classification", "regression", "next_token"

// Labelled samples split into train and test sets (framework/data/dataset.hpp:
// a size and batches by index, so nothing need be held whole in memory).
struct DatasetSplits {
  DatasetPtr train;
  DatasetPtr test;
  Task task = Task::Classification;
  int64_t numFeatures = 0;  // values per sample (the product of sampleShape), for flat models
  int64_t numClasses = 0;   // classes (the vocabulary for next-token data); 0 for regression
  // One sample's shape: [F] for a table, [C, H, W] for images (e.g. [1, 8, 8]),
  // [T] for windows of T tokens.
  std::vector<int64_t> sampleShape;
  int64_t vocabSize = 0;  // token data: ids lie in [0, vocabSize); 0 otherwise
  // Files rank 0 writes into the run folder (name -> contents), e.g. the
  // vocabulary of a text dataset, so a trained model can be used later.
  std::map<std::string, std::string> runFiles;
};

// In-memory splits of a table: features [N, F...], targets [N]; the task
// is classification when numClasses > 0, regression otherwise, and the
// sample shape is the features' shape after the first dimension.
DatasetSplits tensorSplits(at::Tensor trainFeatures, at::Tensor trainTargets, at::Tensor testFeatures,
                           at::Tensor testTargets, int64_t numClasses);

// What a dataset factory may use besides its parameters.
struct DatasetContext {
  uint64_t seed = 0;          // training.seed: same split on every rank
  std::string configDir;      // relative paths in the config resolve against it
};

// A model: a torch module with one tensor in and one out. A model that
// names its units and runs them through runUnit() (sharding_units.hpp) lets
// distributed.strategy=fsdp hold only the running unit's full parameters.
class Model : public torch::nn::Module, public ShardingUnits {
 public:
  virtual at::Tensor forward(const at::Tensor& input) = 0;
};
using ModelPtr = std::shared_ptr<Model>;

// What model factories may use: the dataset's shape.
struct ModelContext {
  int64_t numFeatures = 0;  // values per sample, for flat models
  int64_t numClasses = 0;   // 0 for regression
  std::vector<int64_t> sampleShape;  // as DatasetSplits::sampleShape
  int64_t vocabSize = 0;             // as DatasetSplits::vocabSize
};

// The context a model of `data` is built with. A dataset that leaves
// sampleShape empty gets the shape of its first training sample's inputs.
ModelContext modelContextFor(const DatasetSplits& data);

// Learning rate as a function of the epoch, applied at each epoch start.
// Every scheduler also takes "warmup_steps" (PluginRegistry::add declares
// it for each; 0: none): the trainer scales the scheduler's lr by
// min(1, (s + 1) / warmup_steps) at optimizer step s (0-based, resumed
// steps counted), a linear ramp from base / warmup_steps to the schedule.
class LrScheduler {
 public:
  virtual ~LrScheduler() = default;
  virtual double lrAt(int64_t epoch, double baseLr) const = 0;
};

// The warm-up factor of optimizer step `step` (0-based): min(1, (step + 1)
// / warmupSteps), 1 without warm-up.
inline double warmupFactor(int64_t step, int64_t warmupSteps) {
  if (warmupSteps <= 0 || step + 1 >= warmupSteps) return 1.0;
  return static_cast<double>(step + 1) / static_cast<double>(warmupSteps);
}

using LossFn = std::function<at::Tensor(const at::Tensor& output, const at::Tensor& target)>;

using DatasetFactory = std::function<DatasetSplits(const Params&, const DatasetContext&)>;
// Every model also takes "init_from" (PluginRegistry::add declares it; ""
// by default): the Trainer loads those weights into the built model at a
// run's first start (framework/interop/weights_file.hpp). Factories ignore it.
using ModelFactory = std::function<ModelPtr(const Params&, const ModelContext&)>;
using OptimizerFactory =
    std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor> parameters, const Params&)>;
using SchedulerFactory = std::function<std::unique_ptr<LrScheduler>(const Params&)>;
using LossFactory = std::function<LossFn(const Params&)>;
// How DDP reduces its gradient buckets (distributed.comm_hook): the
// contract is in framework/parallel/comm_hook.hpp. `timeout` is the
// collective timeout of the run, for the hook's own collectives.
using CommHookFactory = std::function<CommHookPtr(const Params&, Milliseconds timeout)>;

// A plugin's factory; which of these it is, is the plugin's kind (the
// alternatives are in PluginKind's order).
using PluginFactory =
    std::variant<DatasetFactory, ModelFactory, OptimizerFactory, SchedulerFactory, LossFactory, CommHookFactory>;

// One plugin. An aggregate, so a registration reads as one statement:
//   registry.add({"mlp", "multi-layer perceptron", {Param(...), ...}, makeMlp});
struct PluginSpec {
  std::string name;
  std::string doc;
  std::vector<ParamSpec> params;
  PluginFactory factory;

  PluginKind kind() const { return static_cast<PluginKind>(factory.index()); }

  // Build the plugin with its factory; calling the one of another kind is a
  // UsageError naming both kinds.
  DatasetSplits dataset(const Params& values, const DatasetContext& context) const;
  ModelPtr model(const Params& values, const ModelContext& context) const;
  std::unique_ptr<torch::optim::Optimizer> optimizer(std::vector<at::Tensor> parameters, const Params& values) const;
  std::unique_ptr<LrScheduler> scheduler(const Params& values) const;
  LossFn loss(const Params& values) const;
  CommHookPtr commHook(const Params& values, Milliseconds timeout) const;
};

class PluginRegistry {
 public:
  // UsageError for an empty name, a name taken within the kind, or an empty
  // factory. A scheduler gets the common parameter warmup_steps declared
  // after its own (LrScheduler), unless it declares one itself.
  void add(PluginSpec spec);
  bool has(PluginKind kind, const std::string& name) const;
  // Throws UsageError listing the known names of that kind.
  const PluginSpec& get(PluginKind kind, const std::string& name) const;
  std::vector<std::string> names(PluginKind kind) const;

  // Human-readable listings for `ddp-run --list-plugins` / `--describe`.
  std::string listing() const;
  std::string describe(const std::string& kindDotName) const;

 private:
  friend void loadPluginLibrary(const std::string& path, PluginRegistry& registry);
  std::map<PluginKind, std::map<std::string, PluginSpec>> plugins_;
  std::set<void*> libraries_;  // dlopen() handles registered here
};

// dlopen()s a shared library and calls its
//   extern "C" void ddp_register_plugins(ddp::PluginRegistry&);
// Throws UsageError naming the path when the file or that symbol is missing,
// and refuses (before registering anything) a library whose
// ddp_plugin_api_version() is missing or differs from DDP_PLUGIN_API_VERSION.
// A library already registered into `registry` is not registered again.
void loadPluginLibrary(const std::string& path, PluginRegistry& registry);

// The table --describe prints for `specs` (param, type, default, range,
// doc), with `extraRows` (five cells each) after them.
std::string describeParams(const std::vector<ParamSpec>& specs,
                           const std::vector<std::vector<std::string>>& extraRows = {});

// The name among `candidates` closest to `name` (edit distance), or "" when
// none is close enough to suggest.
std::string closestName(const std::string& name, const std::vector<std::string>& candidates);

}  // namespace ddp
