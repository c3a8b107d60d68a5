// Trainer: runs an ExperimentConfig on this rank, from data to checkpoints.
//
// Contract
// - Every rank builds the same dataset split and model (seeded by
//   training.seed); with world size > 1 the model is wrapped in
//   DistributedDataParallel and each rank trains on its DistributedSampler
//   shard with training.batch_size samples per step.
// - Per epoch: the train loss (mean over all samples of all ranks), and on
//   evaluation epochs the test loss and accuracy (over the whole test split,
//   sharded across ranks and summed), then one record in metrics.jsonl and
//   metrics.csv and a line in train.log. Only rank 0 writes.
// - Rank 0 creates the run folder and writes config.json there once the
//   dataset, model, optimizer, scheduler and loss are built, so a mistake
//   they find leaves no folder behind.
// - Every training.save_every epochs, and after the last epoch, rank 0
//   writes checkpoints/epoch_NNNNNN.pt
//   (model, optimizer, epoch, step, RNG state) through a temporary file and a
//   rename, so a crash mid-write leaves the previous checkpoint intact; the
//   other ranks wait at a barrier.
// - With resume, training continues after the newest checkpoint and ends
//   with the same parameters as an uninterrupted run; the metrics files then
//   hold one record per epoch, the records of epochs after that checkpoint
//   (run before a crash) dropped.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "framework/launch/distributed.hpp"
#include "framework/experiment/experiment_config.hpp"

namespace ddp {

struct RunOptions {
  std::string runDir;   // created by rank 0 when training starts
  bool resume = false;  // continue from the newest checkpoint in runDir
  bool progress = true; // a progress line with ETA on an interactive terminal
  bool quiet = false;   // no per-epoch lines on stdout (tests)
};

struct EpochMetrics {
  int64_t epoch = 0;  // 1-based
  double trainLoss = 0;
  std::optional<double> testLoss;
  std::optional<double> testAccuracy;
  double seconds = 0;
};

struct TrainResult {
  std::vector<EpochMetrics> history;  // epochs run in this call
  int64_t steps = 0;                  // optimizer steps in total, resumed ones included
  std::vector<at::Tensor> finalParameters;
  // Wall time of the epoch loop (training, evaluation, metrics, checkpoints),
  // without building the dataset, model and optimizer.
  double loopSeconds = 0;
};

TrainResult runTraining(const ExperimentConfig& config, const DistributedContext& dist, const RunOptions& options,
                        PluginRegistry& registry);

// The newest checkpoint in runDir/checkpoints, or "" when there is none.
std::string newestCheckpoint(const std::string& runDir);

// Throws UsageError when runDir already holds a run (metrics or
// checkpoints), which a new run would mix with its own.
void checkRunFolderIsFree(const std::string& runDir);

}  // namespace ddp
