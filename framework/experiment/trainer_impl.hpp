// Private to the Trainer's files (trainer*.cpp): the state build() makes
// and the epochs use, and the helpers the trainer's parts share. The
// Trainer is split by job: trainer.cpp (stages and the epoch loop's
// bookkeeping), trainer_plugins.cpp (building and checking the plugins),
// trainer_run_folder.cpp (the run folder and resuming), trainer_checkpoints.cpp
// (writing checkpoints), trainer_steps.cpp (an epoch's steps, signals),
// trainer_evaluate.cpp (evaluation).
#pragma once

#include <signal.h>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "framework/checkpoint/async_shard_writer.hpp"
#include "framework/experiment/precision.hpp"
#include "framework/launch/elastic.hpp"
#include "framework/experiment/run_log.hpp"
#include "framework/experiment/trainer.hpp"
#include "framework/parallel/sampler.hpp"
#include "framework/parallel/strategy.hpp"

namespace ddp {

// What build() makes and the epochs use.
struct Trainer::Impl {
  bool built = false;
  torch::Device device{torch::kCPU};
  DatasetSplits data;
  ModelPtr model;
  std::unique_ptr<ParallelStrategy> strategy;
  std::unique_ptr<LrScheduler> scheduler;
  LossFn lossFn;
  std::vector<double> baseLrs;
  std::unique_ptr<RunLog> log;
  std::unique_ptr<DistributedSampler> sampler;
  bool join = false;  // unpadded shards; a rank that runs out shadows its peers' last steps
  std::vector<int64_t> testRows;  // this rank's shard of the test split
  int64_t startEpoch = 0;
  int64_t steps = 0;
  bool stop = false;  // training.max_steps reached, or a signal
  std::unique_ptr<RunFolderLock> lock;  // rank 0: this job owns the run folder
  int64_t resumeBatch = 0;              // batches of epoch startEpoch done before (a checkpoint on a signal)
  std::vector<double> resumeSums;       // their loss sum and samples, over all ranks (rank 0 adds them)
  ProcessGroupPtr group;                // this rank's group (an elastic run replaces it)
  std::unique_ptr<ElasticRendezvous> rendezvous;  // --min-ranks
  ElasticMembership membership;
  // Samples of the current epoch's permutation read by all ranks so far,
  // kept across a change of membership (DistributedSampler::remainderForEpoch).
  int64_t consumed = 0;
  int64_t epoch = 0;                    // the epoch being trained (0-based)
  int recoveries = 0;
  // While an elastic run has no strategy (between a lost rank and the new
  // group): the optimizer it handed back, for a checkpoint.
  torch::optim::Optimizer* releasedOptimizer = nullptr;
  bool writesAlone = false;  // that checkpoint is this rank's to write, without a group
  std::chrono::steady_clock::time_point lastJoinPoll{};
  bool watchSignals = false;            // training.checkpoint_on_signal
  at::Tensor signalFlag;                // the agreed stop signal, one int64
  int signal = 0;                       // the signal all ranks stopped on
  int64_t batchesDone = 0;              // of the epoch the signal stopped
  double dataSeconds = 0;               // batch assembly in the current epoch
  bool partialEpoch = false;            // the signal stopped an epoch before its end
  int64_t lastSaved = -1;               // epoch of the last checkpoint written
  std::unique_ptr<AsyncShardWriter> asyncWriter;  // training.async_checkpoint: the save in the background
  // Host copies of the last background save, reused by the next once it is
  // written: first-touch page faults of hundreds of MB cost more than the copy.
  std::vector<at::Tensor> asyncStaging;
  std::vector<std::shared_ptr<TrainerCallback>> callbacks;
  std::vector<TrainerCallback*> stepCallbacks;  // those that want onStepEnd
  Precision precision = Precision::Fp32;        // training.precision
  int64_t warmupSteps = 0;                      // scheduler.warmup_steps
  std::vector<double> epochLrs;                 // the scheduler's lr of this epoch, per param group
  std::string stopReason;                       // Trainer::requestStop's, for TrainResult
  // The last epoch whose end callbacks all ran here (elastic): a rank that
  // a later recovery makes the writer writes that epoch's records where the
  // lost writer had not (Trainer::writeTakenOverRecords).
  std::optional<EpochMetrics> lastEpochEnd;
  bool lastEpochEvaluated = false;
  bool lastEpochLast = false;
};

namespace trainer_detail {

using Clock = std::chrono::steady_clock;

// The store key through which rank 0 tells the others what to resume from.
inline const char* const kStartKey = "ddp-trainer/start";

// "nan" (whatever its sign bit), "inf" or "-inf".
inline const char* nonFiniteName(double v) { return std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf"; }

// What a checkpoint holds besides the model and optimizer.
struct CheckpointState {
  int64_t epoch = 0;  // epochs finished
  int64_t batch = 0;  // batches of the next epoch finished (a checkpoint on a signal)
  int64_t steps = 0;
  std::vector<double> partial;  // that epoch's loss sum and samples so far, over all ranks
  int64_t consumed = 0;         // samples of that epoch's permutation read (mid-epoch)
  int64_t worldSize = 0;        // the world that saved it (0: not recorded, an older checkpoint)
  bool elastic = false;         // an elastic run's: its membership may have changed within the epoch
  // A sharded checkpoint: model and optimizer are loaded once the strategy
  // exists (Trainer::loadShardedState), each rank reading what it holds.
  bool sharded = false;
};

// Every rank, before the strategy exists: model and optimizer state, RNG
// and step count, from the checkpoint at `path` (trainer_run_folder.cpp).
CheckpointState loadCheckpoint(const std::string& path, torch::nn::Module& model, torch::optim::Optimizer& optimizer);

// Rank 0, once the plugins are built and before anything is written: makes
// or (on resume) checks the run folder, and returns the checkpoint to resume
// from ("" for none), loaded into model and optimizer (trainer_run_folder.cpp).
std::string prepareRunFolder(const ExperimentConfig& config, const RunOptions& options, torch::nn::Module& model,
                             torch::optim::Optimizer& optimizer, std::vector<std::string>* notes,
                             CheckpointState* state, std::unique_ptr<RunFolderLock>* lock,
                             const std::map<std::string, std::string>& runFiles);

// An experiment's plugins, as Trainer::build() and the launcher's check
// build them (trainer_plugins.cpp).
struct BuiltPlugins {
  DatasetSplits data;
  ModelPtr model;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::unique_ptr<LrScheduler> scheduler;
  LossFn lossFn;
};

// Seeds LibTorch with training.seed (the same split and initial weights on
// every rank), builds each plugin (an error names it), moves the model to
// `device` before the optimizer takes its parameters, and, when `checkFit`,
// runs the model and the loss on two rows there (checkPluginsFit).
BuiltPlugins buildPlugins(const ExperimentConfig& config, PluginRegistry& registry, const torch::Device& device,
                          bool checkFit);

// The signal that stopped training (0: none), set by the handler
// StopSignals installs (trainer_steps.cpp).
extern std::atomic<int> gStopSignal;

// SIGTERM and SIGINT while a run with training.checkpoint_on_signal trains:
// the handler records the signal, the training loop acts on it at the next
// step. A second signal takes its default action at once. The previous
// handlers come back when it goes.
class StopSignals {
 public:
  explicit StopSignals(bool enabled);
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  bool enabled_;
  struct sigaction oldTerm_ {}, oldInt_ {};
};

}  // namespace trainer_detail
}  // namespace ddp
