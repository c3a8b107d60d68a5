// EarlyStopping: training.early_stopping. Ends the run once the monitored
// metric has not improved (monitor.hpp: by more than min_delta, in the
// mode's direction) for `patience` evaluations in a row.
//
// Contract
// - Added on every rank. Only evaluation epochs count (training.eval_every;
//   train_loss too, so the run ends on an epoch with test metrics); others
//   run no collective. eval_every 0 is refused with early stopping.
// - Rank 0 keeps the best value and the count, decides, and broadcasts the
//   decision (decidedOnRankZero): every rank stops after the same epoch.
// - Stopping is Trainer::requestStop with a line that says why (the
//   metric, the patience, the best value and its epoch); the latest
//   checkpoint is still written (save_every > 0), the metrics files hold
//   every epoch run, and ddp-run exits with 0.
// - On resume, rank 0 rebuilds its state from metrics.jsonl's records up to
//   the checkpoint's epoch, so a resumed run stops where an uninterrupted
//   one would.
#pragma once

#include <optional>

#include "framework/experiment/callbacks/callback.hpp"

namespace ddp {

class EarlyStopping : public TrainerCallback {
 public:
  void onTrainBegin(Trainer& trainer) override;
  void onEpochEnd(Trainer& trainer, EpochEnd& end) override;

 private:
  void see(int64_t epoch, double value);
  void restore(Trainer& trainer, int64_t upTo);  // from metrics.jsonl's epochs up to upTo
  bool restored_ = false;
  int64_t lastSeen_ = 0;  // the epoch see() took last
  std::optional<double> best_;
  int64_t bestEpoch_ = 0;
  int64_t bad_ = 0;  // evaluations since the best one
  bool maximize_ = false;
  double minDelta_ = 0;
};

}  // namespace ddp
