// Trainer: runs an ExperimentConfig on this rank, from data to checkpoints.
//
// Contract
// - Every rank builds the same dataset split and model (seeded by
//   training.seed); the model and optimizer go to the parallel strategy
//   named by distributed.strategy (framework/parallel/strategy.hpp; "ddp":
//   DistributedDataParallel with world size > 1, a local one on one rank),
//   and each rank trains on its DistributedSampler shard with
//   training.batch_size samples per micro-batch.
// - Stages: build() (devices, plugins, run folder, resume: the newest
//   checkpoint loaded into model and optimizer, then the strategy),
//   trainEpoch(), evaluate(), saveCheckpoint(); run()
//   drives them epoch by epoch and calls the callbacks
//   (callbacks/callback.hpp) at their points. What a run writes besides
//   training (metrics files, train.log lines, the progress line,
//   checkpoints, DDP_FAULT_INJECT) is a callback that
//   addStandardCallbacks() adds; runTraining() is that, then run().
// - Per epoch: the train loss (mean over all samples of all ranks), and on
//   evaluation epochs the test loss and accuracy (over the whole test split,
//   sharded across ranks and summed), then one record in metrics.jsonl and
//   metrics.csv and a line in train.log. Only rank 0 writes.
// - A micro-batch whose loss is NaN or infinite stops the run before the
//   optimizer steps on it (NonFiniteLossError, naming epoch, step and rank),
//   unless training.on_nonfinite_loss is "continue"; the records of earlier
//   epochs stay. Other ranks are stopped by the launcher (or by the next
//   collective failing); the epoch's reduced loss is checked too, so ranks
//   that all reach it stop together.
// - Before the run folder exists, build() runs the model and the loss on two
//   training rows, so a dataset, model and loss that do not fit together
//   fail as one UsageError line; a plugin that runs out of memory while it
//   is built does too.
// - Rank 0 creates the run folder once the dataset, model, optimizer,
//   scheduler and loss are built, so a mistake they find leaves no folder
//   behind; it locks the folder for the job (RunFolderLock, run_folder.hpp),
//   checks that the folder, and checkpoints/ when the run saves any, can be
//   written, writes model_context.json (trained_model.hpp) and the files the
//   dataset asks for (DatasetSplits::runFiles, e.g. a vocabulary), and
//   config.json last. The other ranks learn through the
//   store (key "ddp-trainer/start") which checkpoint to load, or that rank 0
//   refused, and fail with it.
// - Every training.save_every epochs, and after the last epoch, rank 0
//   writes checkpoints/epoch_NNNNNN.pt
//   (model, optimizer, epoch, step, RNG state) through a temporary file and a
//   rename, so a crash mid-write leaves the previous checkpoint intact; the
//   other ranks wait at a barrier. A write that fails (a full disk) removes
//   the temporary file and ends the run on every rank with one line naming
//   the file and the reason.
// - Resume (RunOptions::resume) checks before it changes anything: the
//   folder exists and holds config.json; the experiment differs from it only
//   in settings resume_rules.hpp lists as safe (each change is logged); the
//   newest checkpoint by epoch number that loads is used, and one that does
//   not is named in the log (none loads: an error, the folder untouched); a
//   folder with metrics but no checkpoint is refused, not started over. The
//   optimizer keeps the experiment's hyper-parameters, not the checkpoint's.
//   Training continues after that checkpoint and ends with the same
//   parameters as an uninterrupted run; the metrics files then hold one
//   record per epoch, the records of epochs after that checkpoint (run
//   before a crash) dropped. RunOptions::restart (a launcher's or
//   scheduler's restart) starts a folder that holds no run yet, and starts
//   over when there is no checkpoint, keeping the earlier attempt's records
//   as metrics.before-restart-K.jsonl/.csv (and steps.before-restart-K.jsonl).
// - Each optimizer step: the gradients are clipped to training.clip_grad_norm
//   (ParallelStrategy::setGradientClipping: the global norm over all ranks
//   and shards); the learning rate is the scheduler's for the epoch times
//   the warm-up factor of the step (scheduler.warmup_steps); with
//   training.precision "bf16" the forward (training and evaluation) runs
//   under autocast (precision.hpp) and the loss in fp32.
// - Elastic (RunOptions::minRanks > 0, launch/elastic.hpp,
//   trainer_recovery.cpp): a collective that fails in a training step or in
//   the epoch's evaluation and sums sends the members to a new membership;
//   the strategy is rebuilt over its group from the furthest member's model
//   and optimizer (broadcast), and the epoch goes on with what is left of
//   it dealt over the new world. Ranks waiting to join are admitted the
//   same way at a step boundary. group(), rank() and worldSize() are then
//   the new group's; rank 0 writes the records (the writer may change). A
//   failure in an epoch-end callback's collective recovers too, and that
//   callback runs again (callback.hpp).
// - Callbacks may end the run after an epoch (requestStop: early stopping)
//   and write extra checkpoints (saveCheckpointAs: the best ones).
// - training.checkpoint_on_signal: SIGTERM and SIGINT set a flag during
//   run(); after each optimizer step the ranks agree on it (one allreduce of
//   one number, only with this setting), stop after the same step, and rank
//   0 saves checkpoints/epoch_E_batch_B.pt (B batches into epoch E, counted
//   from 1; with that epoch's loss sums so
//   far) or, at an epoch's end, epoch_E.pt; run() returns with
//   TrainResult::signal set. A second signal takes the default action. The
//   previous handlers are restored when run() returns.
#pragma once

#include <chrono>
#include <memory>
#include <stdexcept>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "framework/launch/distributed.hpp"
#include "framework/experiment/callbacks/callback.hpp"
#include "framework/experiment/experiment_config.hpp"
#include "framework/experiment/run_folder.hpp"

namespace ddp {

struct RunOptions {
  std::string runDir;   // created by rank 0 when training starts
  bool resume = false;  // continue from the newest checkpoint in runDir
  // With resume: a restart by a launcher or scheduler, which starts the run
  // when the folder holds none yet and may start it over without a checkpoint.
  bool restart = false;
  bool progress = true; // a progress line with ETA on an interactive terminal
  bool quiet = false;   // no per-epoch lines on stdout (tests)
  // Elastic training (launch/elastic.hpp, trainer_recovery.cpp): > 0 keeps
  // training when a rank is lost, as long as this many remain.
  int minRanks = 0;
  // This process replaces a lost rank of a running job: it joins at the
  // next step boundary and takes its state from a peer.
  bool elasticJoin = false;
};

struct EpochMetrics {
  int64_t epoch = 0;  // 1-based
  double trainLoss = 0;
  std::optional<double> testLoss;
  std::optional<double> testAccuracy;     // classes, or tokens for next-token data
  std::optional<double> testPerplexity;   // next-token data: exp(test loss per token)
  std::optional<double> testRmse;         // regression
  double seconds = 0;
  // Of `seconds`, the time spent assembling training batches
  // (Dataset::get and the copy to the device), the mean over ranks: what a
  // prefetching loader could at most hide.
  double dataSeconds = 0;
  // Memory at the end of the epoch, the largest over ranks: bytes held in
  // parameters, gradients and optimizer state between steps (the
  // strategy's own count, ParallelStrategy::heldBytes) and the peak
  // resident memory of the rank's process so far.
  int64_t parameterBytes = 0, gradientBytes = 0, optimizerBytes = 0, peakRssBytes = 0;
  // Metrics that callbacks add (name, value), written to metrics.jsonl after
  // the standard ones.
  std::vector<std::pair<std::string, double>> extra;
};

struct TrainResult {
  std::vector<EpochMetrics> history;  // epochs run in this call
  int64_t steps = 0;                  // optimizer steps in total, resumed ones included
  std::vector<at::Tensor> finalParameters;
  // Wall time of the epoch loop (training, evaluation, metrics, checkpoints),
  // without building the dataset, model and optimizer.
  double loopSeconds = 0;
  // The signal that stopped the run (training.checkpoint_on_signal), or 0.
  int signal = 0;
  // Why the run stopped before training.epochs (Trainer::requestStop, e.g.
  // early stopping); "" otherwise.
  std::string stopReason;
  // The group the run ended with: the one it started with unless an
  // elastic run changed its membership.
  ProcessGroupPtr group;
  int recoveries = 0;  // membership changes of an elastic run
};

class ParallelStrategy;
class RunLog;
struct StrategyContext;

class Trainer {
 public:
  Trainer(const ExperimentConfig& config, const DistributedContext& dist, const RunOptions& options,
          PluginRegistry& registry);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // In the order they run; before run().
  void addCallback(std::shared_ptr<TrainerCallback> callback);
  // Fault injection (DDP_FAULT_INJECT), the progress line, metrics.jsonl and
  // metrics.csv, the per-epoch log line, periodic checkpoints.
  void addStandardCallbacks();

  // Stages.
  void build();  // devices, plugins, run folder, strategy, resume; once
  // Trains one epoch (0-based) on this rank's shard: the local sum of the
  // loss over its samples, and their number.
  std::pair<double, double> trainEpoch(int64_t epoch);
  // This rank's part of the test split: loss sum, correct predictions,
  // samples.
  std::vector<double> evaluate();
  // Every rank; rank 0 writes checkpoints/epoch_NNNNNN.pt (model,
  // optimizer, epoch, steps, RNG state), the others wait at a barrier.
  void saveCheckpoint(int64_t epoch);
  // The same checkpoint written as checkpoints/NAME (NAME may hold a
  // folder, e.g. "best/epoch_000004.pt"; it is created), atomically.
  // Collective, like saveCheckpoint. Resume does not read these.
  void saveCheckpointAs(const std::string& name, int64_t epoch);
  // From a callback's onEpochEnd, on every rank with the same decision: the
  // run ends after this epoch (EpochEnd::lastEpoch is then true for the
  // callbacks after it, so the latest checkpoint is written), with `reason`
  // logged and returned in TrainResult::stopReason. Exit code 0.
  void requestStop(const std::string& reason);
  // build() when not done yet, then the epochs, with the callbacks. An
  // exception ends the run; once the run folder exists, its one line is
  // appended to train.log first.
  TrainResult run();

  // For callbacks.
  const ExperimentConfig& config() const { return config_; }
  const RunOptions& options() const { return options_; }
  ProcessGroup& group() const;
  ProcessGroupPtr groupPtr() const;
  int rank() const;
  int worldSize() const;
  // The elastic membership's generation: a new group each (0 otherwise).
  int64_t generation() const;
  bool isWriter() const { return rank() == 0; }
  // isWriter(), and in an elastic run not left out meanwhile: a writer that
  // froze and woke after the others went on without it writes no epoch
  // record after theirs. One or two store reads, by the epoch-end callbacks
  // that write (not once a step). A store that cannot be read: true (the
  // next collective decides; a writer cut off from the store and the others
  // can still write a record before it learns it was left out). A writer
  // that freezes after this check and before its write can too.
  bool writesEpochRecords() const;
  Task task() const;  // the dataset's, after build()
  ParallelStrategy& strategy();
  RunLog& log();
  int64_t startEpoch() const;  // epochs done before this call (resume)
  int64_t steps() const;       // optimizer steps so far, resumed ones included
  int64_t trainSamples() const;  // the training split's size, after build()
  // Elastic runs (tests): waits until `count` ranks ask to join (and are
  // not admitted yet) or `timeout` passes; true when they ask, and then
  // this step's agreement sees them.
  bool awaitJoinRequest(std::chrono::milliseconds timeout, int64_t count = 1);

 private:
  TrainResult runStages();
  // An epoch's training loss so far, counted once a step is done.
  struct EpochSums {
    double lossSum = 0;
    int64_t seen = 0;
    double pendingLoss = 0;  // micro-batches of the step in flight
    int64_t pendingSeen = 0;
  };
  // The epoch's steps over this group, from `firstBatch` (or what is left
  // of the epoch after a change of membership); false when the membership
  // changed at a step boundary and the rest must be dealt again.
  bool trainSegment(int64_t epoch, int64_t firstBatch, EpochSums& sums);
  // Takes `optimizer` into the new strategy; if building it throws (a rank
  // lost while DDP allocates its buckets), `optimizer` is handed back.
  // statesEqual: every rank holds the same state already (after an elastic
  // recovery's syncState): DDP skips its model check and broadcast.
  void makeStrategy(std::unique_ptr<torch::optim::Optimizer>& optimizer, bool statesEqual = false);
  void buildStrategy(StrategyContext& context, bool statesEqual);  // makeStrategy's body
  void shardData();  // sampler and test rows for this rank of this group
  // Elastic (trainer_recovery.cpp).
  bool recoverable(const std::exception& e) const;
  // After a collective failed; true when it made this rank the writer
  // (the last ended epoch's records are then written: the caller writes
  // those of an epoch whose callbacks were running).
  bool recover(const std::string& why);
  void admitJoiners();  // agreed at a step boundary
  bool reconfigure(const std::string& why, bool broken);  // recover's result
  void joinRunningJob(std::unique_ptr<torch::optim::Optimizer> optimizer);
  void formGroup(torch::optim::Optimizer& optimizer);  // the decided membership's group, and the state
  // On a rank that a recovery has just made the writer: the writerOnly
  // callbacks among the first `count` write `end`'s epoch where the lost
  // writer had not (they skip what the files already hold).
  void writeTakenOverRecords(EpochEnd& end, size_t count);
  void syncState(torch::optim::Optimizer& optimizer);
  // After a timeout with every member alive (trainer_recovery.cpp).
  void leaveOutSlowHost(torch::optim::Optimizer& optimizer);
  bool elasticAgreement();  // per step: signals and joins, agreed; true when joiners wait
  struct Impl;
  const ExperimentConfig& config_;
  const DistributedContext& dist_;
  const RunOptions options_;
  PluginRegistry& registry_;
  std::unique_ptr<Impl> impl_;

  void writeCheckpoint(int64_t epoch, int64_t batch, const std::vector<double>& partial,
                       const std::string& name = "");
  void writeShardedCheckpoint(int64_t epoch, int64_t batch, const std::vector<double>& partial,
                              const std::string& name, bool background = false);
  // Every rank, once the strategy exists: what it holds, read from the
  // sharded checkpoint at `path`; fails on every rank when one fails.
  void loadShardedState(const std::string& path);
  // Sets the optimizer's learning rates: the scheduler's for this epoch
  // times the warm-up factor of the next step.
  void applyLearningRates();
};

// A training loss (one micro-batch's, or an epoch's mean over the ranks)
// that is NaN or infinite, with training.on_nonfinite_loss "stop" (the
// default): the message names the epoch, the step and the rank. ddp-run
// exits with 3.
class NonFiniteLossError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An exception's message as one line: LibTorch's errors without their
// backtrace, line breaks made spaces.
std::string errorLine(const std::exception& e);

// Builds the experiment's dataset, model, optimizer, scheduler and loss on
// the CPU, as every rank's Trainer::build() does, and (for a CPU
// experiment) runs the model and the loss on two training rows: a launcher
// calls it before it starts any rank,
// so that what only the built plugins can tell (a model that does not fit
// its dataset) is one line and exit code 2, not one line per rank. Throws
// as build() would (UsageError for the input's mistakes).
void checkExperimentBuilds(const ExperimentConfig& config, PluginRegistry& registry);

// Trainer(config, dist, options, registry), its standard callbacks, run().
TrainResult runTraining(const ExperimentConfig& config, const DistributedContext& dist, const RunOptions& options,
                        PluginRegistry& registry);

// Throws UsageError when runDir already holds a run (metrics or
// checkpoints), which a new run would mix with its own.
void checkRunFolderIsFree(const std::string& runDir);

}  // namespace ddp
