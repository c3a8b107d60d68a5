// PluginRegistry: the datasets, models, optimizers, lr schedulers and losses
// that an experiment JSON can name.
//
// Contract
// - Each plugin has a kind, a unique name within its kind, a one-line doc,
//   and declares its parameters (name, type, default, range or choices, doc).
//   Experiment validation checks a config section against that declaration,
//   so a plugin's factory receives only well-typed values, with defaults
//   filled in.
// - Registration is explicit: ddp::registerBuiltinPlugins() (plugins/builtin.hpp)
//   for the ones shipped in plugins/, and `ddp_register_plugins(ddp::PluginRegistry&)` exported
//   with C linkage by an out-of-tree shared library (see loadPluginLibrary).
//   A name registered twice within a kind is a UsageError.
// - Unknown names fail with UsageError listing the known ones (and the
//   closest, as "did you mean").
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace ddp {

using Json = nlohmann::json;

enum class PluginKind { Dataset, Model, Optimizer, Scheduler, Loss };
const char* pluginKindName(PluginKind kind);  // "dataset", "model", ...
std::optional<PluginKind> pluginKindFromName(const std::string& name);

enum class ParamType { Int, Float, Bool, String, IntList, FloatList };
const char* paramTypeName(ParamType type);  // "int", "float", ...

struct ParamSpec {
  std::string name;
  ParamType type = ParamType::Float;
  Json defaultValue;  // null: required
  std::optional<double> min;  // inclusive bounds for numbers (for lists: each element)
  std::optional<double> max;
  bool minExclusive = false;  // "> 0" rather than ">= 0"
  std::vector<std::string> choices;  // for strings, when non-empty
  std::string doc;
  // A string naming an input file: validation checks that it exists and
  // resolves it (against the config's folder, then the working folder, then
  // the source tree), so a missing data file fails before anything runs.
  bool isFile = false;
};

// A plugin's validated parameters: every declared name present, defaults applied.
class Params {
 public:
  Params() = default;
  explicit Params(Json values) : values_(std::move(values)) {}
  int64_t getInt(const std::string& name) const { return values_.at(name).get<int64_t>(); }
  double getDouble(const std::string& name) const { return values_.at(name).get<double>(); }
  bool getBool(const std::string& name) const { return values_.at(name).get<bool>(); }
  std::string getString(const std::string& name) const { return values_.at(name).get<std::string>(); }
  std::vector<int64_t> getIntList(const std::string& name) const {
    return values_.at(name).get<std::vector<int64_t>>();
  }
  std::vector<double> getDoubleList(const std::string& name) const {
    return values_.at(name).get<std::vector<double>>();
  }
  const Json& json() const { return values_; }

 private:
  Json values_ = Json::object();
};

// ---- what each kind of plugin produces -----------------------------------------

// A labelled table split into train and test sets, held in memory.
struct DatasetSplits {
  at::Tensor trainFeatures;  // [N, F] float32
  at::Tensor trainTargets;   // [N] int64 for classification, [N] or [N, T] float32 for regression
  at::Tensor testFeatures;
  at::Tensor testTargets;
  int64_t numFeatures = 0;
  int64_t numClasses = 0;  // 0 for regression
};

// What a dataset factory may use besides its parameters.
struct DatasetContext {
  uint64_t seed = 0;          // training.seed: same split on every rank
  std::string configDir;      // relative paths in the config resolve against it
};

// A model: a torch module with one tensor in and one out.
class Model : public torch::nn::Module {
 public:
  virtual at::Tensor forward(const at::Tensor& input) = 0;
};
using ModelPtr = std::shared_ptr<Model>;

// What model factories may use: the dataset's shape.
struct ModelContext {
  int64_t numFeatures = 0;
  int64_t numClasses = 0;
};

// Learning rate as a function of the epoch, applied at each epoch start.
class LrScheduler {
 public:
  virtual ~LrScheduler() = default;
  virtual double lrAt(int64_t epoch, double baseLr) const = 0;
};

using LossFn = std::function<at::Tensor(const at::Tensor& output, const at::Tensor& target)>;

using DatasetFactory = std::function<DatasetSplits(const Params&, const DatasetContext&)>;
using ModelFactory = std::function<ModelPtr(const Params&, const ModelContext&)>;
using OptimizerFactory =
    std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor> parameters, const Params&)>;
using SchedulerFactory = std::function<std::unique_ptr<LrScheduler>(const Params&)>;
using LossFactory = std::function<LossFn(const Params&)>;

struct PluginSpec {
  PluginKind kind = PluginKind::Dataset;
  std::string name;
  std::string doc;
  std::vector<ParamSpec> params;
  // Exactly the one matching `kind` is set.
  DatasetFactory dataset;
  ModelFactory model;
  OptimizerFactory optimizer;
  SchedulerFactory scheduler;
  LossFactory loss;
};

class PluginRegistry {
 public:
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
// Throws UsageError naming the path when the file or the symbol is missing.
// A library already registered into `registry` is not registered again.
void loadPluginLibrary(const std::string& path, PluginRegistry& registry);

// The name among `candidates` closest to `name` (edit distance), or "" when
// none is close enough to suggest.
std::string closestName(const std::string& name, const std::vector<std::string>& candidates);

}  // namespace ddp
