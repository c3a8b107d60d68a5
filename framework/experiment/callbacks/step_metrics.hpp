// StepMetrics: what a run's steps look like, and which rank holds the
// others up.
//
// - steps.jsonl (rank 0): one record every training.log_every optimizer
//   steps (0: about four per epoch): step, time (Unix seconds), epoch (1-based), world_size
//   (the ranks that took the step: an elastic run's changes), lr, loss (that
//   micro-batch's), samples_per_s (all ranks, since the last record),
//   step_ms (mean since the last record) and comm_wait_ms (the mean time
//   rank 0 waited for gradient communication after backward: what overlap
//   did not hide; null where the strategy does not measure it), and with
//   training.clip_grad_norm, grad_norm: that step's global gradient norm
//   before clipping; in a restarted job (ddp-run --max-restarts, torchrun,
//   a requeued SLURM job), restart: which restart recorded it (steps redone
//   from the newest checkpoint appear again, with it). A step that an
//   elastic recovery handed over (another member had done it, rank 0 had
//   not) gets a record of its own with from_state and no figures: every
//   step is in the file once.
// - Straggler report (world size > 1): per epoch each rank's compute time (its steps minus
//   that wait) and its communication wait go into metrics.jsonl
//   (rank_R_compute_s, rank_R_comm_wait_s). At the end, one line in
//   train.log names the slowest rank when its compute took over 10% (and
//   0.5 s over the run) more than the fastest's. (After an elastic
//   run's change of membership, the report covers the new group's epochs.)
// - Slow host links (ranks on 2 hosts or more, not NCCL): at the end of a
//   group's first 3 epochs, then of every 5th, the links between hosts are
//   probed (comm/link_probe.hpp: 256 KiB from each host's first rank to
//   the next host's); that epoch's record has link_E_mbit_s for host E to
//   host E + 1 (hosts in the order of their first rank). At the end, a
//   `straggler: host H (ranks ...)` line names a host both of whose links
//   took 4x the fastest link's time and 10 ms more, in at least 2 probes
//   and a quarter of them (3 hosts or more: with 2 there is one link, and
//   no one to blame). Every rank's host name is gathered once per group
//   (elastic generation).
// - It runs its collectives at each epoch end (a small allreduce; the
//   probe's sends and one allreduce), so every rank adds it, in the same
//   place among the callbacks.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "framework/core/append_file.hpp"
#include "framework/experiment/callbacks/callback.hpp"

namespace ddp {

class TensorBoardLog;

class StepMetrics : public TrainerCallback {
 public:
  // `tensorboard` (may be null) also receives each record.
  explicit StepMetrics(std::shared_ptr<TensorBoardLog> tensorboard = nullptr) : tensorboard_(std::move(tensorboard)) {}
  bool wantsSteps() const override { return true; }
  void onTrainBegin(Trainer& trainer) override;
  void onEpochBegin(Trainer& trainer, int64_t epoch) override;
  void onStepEnd(Trainer& trainer, const StepEnd& step) override;
  void onEpochEnd(Trainer& trainer, EpochEnd& end) override;
  void onTrainEnd(Trainer& trainer) override;

 private:
  static constexpr int64_t kLinkProbeBytes = 256 * 1024;
  void probeLinks(Trainer& trainer, EpochEnd& end);
  void reportSlowHost(Trainer& trainer);
  using Clock = std::chrono::steady_clock;
  int64_t every_ = 0;  // steps between records; 0 until the first epoch sets it
  int64_t lastStep_ = -1;  // the trainer's step count at this rank's last optimizer step
  int64_t restart_ = 0;    // this process's restart of the job (0: the first attempt)
  Clock::time_point stepStart_, recordStart_;
  int64_t stepsSinceRecord_ = 0, samplesSinceRecord_ = 0;
  double waitSinceRecord_ = 0;
  bool waitMeasured_ = true;
  double epochCompute_ = 0, epochWait_ = 0;        // this rank, this epoch
  std::vector<double> runCompute_, runWait_;        // every rank, summed over the present group's epochs
  std::string path_;
  AppendFile file_;
  int64_t generation_ = -1;  // the group (elastic generation) whose host names hostOfRank_ holds
  std::vector<std::string> hostOfRank_;
  std::vector<std::vector<double>> edgeSeconds_;  // per epoch probed, per edge
  int64_t epochsInGroup_ = 0;                     // epoch ends seen by the present group
  std::shared_ptr<TensorBoardLog> tensorboard_;
};

}  // namespace ddp
