// ExperimentConfig: an experiment JSON, validated against the plugin
// registry before anything runs.
//
// Contract
// - loadExperimentConfig() reads, parses and validates; every failure is one
//   ConfigError line that names the file or JSON path, e.g.
//   `optimizer.lr: expected a number > 0, got "fast"`: malformed JSON (with
//   line and column), unknown keys (with "did you mean"), wrong types,
//   out-of-range values, unknown plugin names (listing the known ones),
//   missing required parameters and missing input files, keys given twice
//   in one object (at any depth), numbers beyond a double's range (with line
//   and column), and a `name` that is not a plain folder name.
// - Overrides ("optimizer.lr=0.01") are applied before validation and typed
//   by the declaration of the parameter they set.
// - The result holds the resolved config: defaults filled in, overrides
//   applied, input paths made absolute. It is what a run saves as config.json.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "framework/core/errors.hpp"
#include "framework/experiment/plugin_registry.hpp"

namespace ddp {

// A user mistake in an experiment or its overrides; ddp-run exits with 2.
class ConfigError : public UsageError {
 public:
  using UsageError::UsageError;
};

struct PluginChoice {
  std::string name;
  Params params;
};

struct TrainingConfig {
  int64_t epochs = 1;
  int64_t batchSize = 32;  // per rank
  uint64_t seed = 0;
  int64_t saveEvery = 0;   // epochs between checkpoints; 0 = none
  int64_t evalEvery = 1;   // epochs between evaluations; 0 = only the last
  int64_t maxSteps = 0;    // optimizer steps; 0 = no limit
  int64_t accumulateGradBatches = 1;
  int64_t evalBatchSize = 512;
  int64_t logEvery = 0;    // steps between steps.jsonl records; 0 = about four per epoch
  int64_t threads = 0;     // intra-op threads per rank; 0 = leave as set (ddp-run: cores / ranks)
  bool dropLast = false;
  // Uneven shards without padding; ranks that run out shadow the last steps
  // (ParallelStrategy::shadowBackward). Strategies that cannot shadow pad.
  bool join = true;
  bool stopOnNonfiniteLoss = true;  // training.on_nonfinite_loss: "stop" or "continue"
  // SIGTERM or SIGINT mid-training: finish the step, save a checkpoint of
  // that point on rank 0, exit 128+signal (trainer.hpp).
  bool checkpointOnSignal = false;
  // training.checkpoint_format: "consolidated" (one file, rank 0 gathers
  // and writes it) or "sharded" (every rank writes what it holds, an index
  // last: framework/checkpoint). "auto" in the experiment resolves to
  // sharded for zero1, zero2, fsdp and hsdp, consolidated otherwise.
  std::string checkpointFormat = "consolidated";
  // Periodic sharded checkpoints written on a background thread.
  bool asyncCheckpoint = false;
  // TensorBoard event files beside metrics.jsonl (callbacks/tensorboard_log.hpp).
  bool tensorboard = false;
  // A timeline of optimizer steps traceStart .. traceStart + traceSteps - 1
  // in trace.json (callbacks/trace_writer.hpp); DDP_TRACE=1 turns it on too.
  bool trace = false;
  int64_t traceStart = 2;
  int64_t traceSteps = 3;
  // The global L2 norm of the gradients, over every rank's shard, clipped to
  // this before each optimizer step (ParallelStrategy::setGradientClipping);
  // 0: off.
  double clipGradNorm = 0;
  // "fp32", or "bf16": forward and backward under autocast to bfloat16,
  // master weights, gradients and optimizer state in fp32
  // (experiment/precision.hpp).
  std::string precision = "fp32";
  // training.early_stopping (callbacks/early_stopping.hpp); nullopt: off.
  struct EarlyStopping {
    std::string monitor = "test_loss";  // a name of monitorNames()
    bool maximize = false;              // mode "max" (or "auto" for an accuracy)
    int64_t patience = 3;               // evaluations without improvement before stopping
    double minDelta = 0;                // smaller changes are no improvement
  };
  std::optional<EarlyStopping> earlyStopping;
  // training.keep_best: the K best checkpoints by keepBestMonitor, beside
  // the latest (callbacks/best_checkpoints.hpp); 0: off.
  int64_t keepBest = 0;
  std::string keepBestMonitor = "test_loss";
  bool keepBestMaximize = false;
};

// The metrics training.early_stopping and training.keep_best_by can follow,
// and whether a larger value is better for each (mode "auto").
const std::vector<std::string>& monitorNames();
bool largerIsBetter(const std::string& monitor);

struct DistributedConfig {
  std::string backend = "gloo";
  std::string device = "cpu";  // "cpu" or "cuda" (rank r uses cuda:LOCAL_RANK)
  int64_t nprocPerNode = 1;    // the launcher's default when --nproc-per-node is not given
  int64_t nnodes = 1;          // as recorded in a run's config.json
  double timeoutSeconds = 300;
  bool findUnusedParameters = false;
  double bucketCapMb = 25;
  double firstBucketCapMb = 1;
  std::string strategy = "ddp";  // a name in builtinStrategies() (framework/parallel/strategy.hpp)
  bool fsdpBackwardPrefetch = true;
  double fsdpUnitMb = 0;
  // hsdp: ranks per shard group (0: the ranks of one node).
  int64_t shardSize = 0;
  // distributed.comm_hook: how DDP averages its buckets (null: allreduce).
  std::optional<PluginChoice> commHook;
};

struct ExperimentConfig {
  std::string name;
  std::string sourcePath;  // the file it came from ("" for text)
  std::string configDir;   // where its relative paths resolve
  std::vector<std::string> pluginLibraries;  // absolute paths
  PluginChoice dataset, model, optimizer, loss;
  std::optional<PluginChoice> scheduler;
  TrainingConfig training;
  DistributedConfig distributed;
  Json resolved;  // the whole resolved config
};

// Reads `path`; `overrides` are "a.b=value" strings from --set.
ExperimentConfig loadExperimentConfig(const std::string& path, const std::vector<std::string>& overrides,
                                      PluginRegistry& registry);

// The same from text; `sourceName` labels errors, `configDir` resolves paths.
ExperimentConfig parseExperimentConfig(const std::string& text, const std::string& sourceName,
                                       const std::string& configDir, const std::vector<std::string>& overrides,
                                       PluginRegistry& registry);

// One plugin section of a file that training wrote (a run's config.json),
// checked as the section of an experiment file is: `body` is an object
// with "name" and the plugin's parameters. Errors are ConfigErrors that
// start with `sourceName` and the section's path.
PluginChoice parsePluginSection(const Json& body, const std::string& section, PluginKind kind,
                                const std::string& sourceName, PluginRegistry& registry);

// Declarations of the built-in sections, for --describe and docs.
const std::vector<ParamSpec>& trainingParamSpecs();
const std::vector<ParamSpec>& distributedParamSpecs();
const std::vector<ParamSpec>& earlyStoppingParamSpecs();  // training.early_stopping

// What `ddp-run --describe SECTION` prints for "training", "distributed"
// and "plugins" (the top level: every key of an experiment file, the plugin
// sections with the names `registry` knows); nullopt for anything else.
std::optional<std::string> describeSection(const std::string& section, const PluginRegistry& registry);

// A JSON Schema (draft 2020-12) of the experiment format, from the same
// declarations as validation and --describe, with the plugins `registry`
// knows: `ddp-run --schema`, for editors that complete and check files.
// The schema checks structure, types, ranges and choices; what it cannot
// say (files exist, a name fits a folder, a plugin's own checks) the
// parser still refuses.
Json experimentSchema(const PluginRegistry& registry);

}  // namespace ddp
