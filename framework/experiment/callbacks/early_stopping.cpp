// training.early_stopping (early_stopping.hpp).
#include "framework/experiment/callbacks/early_stopping.hpp"

#include <fmt/format.h>

#include "framework/experiment/callbacks/monitor.hpp"
#include "framework/experiment/trainer.hpp"

namespace ddp {

void EarlyStopping::onTrainBegin(Trainer& trainer) {
  const auto& e = *trainer.config().training.earlyStopping;
  maximize_ = e.maximize;
  minDelta_ = e.minDelta;
  if (!trainer.isWriter()) return;
  restore(trainer, trainer.startEpoch());
}

void EarlyStopping::restore(Trainer& trainer, int64_t upTo) {
  restored_ = true;
  if (upTo == 0) return;
  const auto& e = *trainer.config().training.earlyStopping;
  const int64_t every = trainer.config().training.evalEvery;
  for (const auto& [epoch, value] : pastValues(trainer.options().runDir, e.monitor, upTo)) {
    // The epochs an uninterrupted run evaluates before this one: eval_every's
    // (the last epoch of an earlier, shorter run was evaluated as its last,
    // which this run's would not have been).
    if (every > 0 && epoch % every == 0) see(epoch, value);
  }
}

void EarlyStopping::see(int64_t epoch, double value) {
  if (improves(value, best_, maximize_, minDelta_)) {
    best_ = value;
    bestEpoch_ = epoch;
    bad_ = 0;
  } else {
    ++bad_;
  }
}

void EarlyStopping::onEpochEnd(Trainer& trainer, EpochEnd& end) {
  const auto& e = *trainer.config().training.earlyStopping;
  // Only evaluation epochs count (train_loss too), so the run stops on an
  // epoch with test metrics. The same on every rank.
  const std::optional<double> value = monitoredValue(end.metrics, e.monitor);
  if (!end.evaluated || !value) return;
  bool stop = false;
  if (trainer.isWriter()) {
    // A rank that became the writer after a rank left (elastic) takes up
    // the state from the records.
    if (!restored_) restore(trainer, end.metrics.epoch - 1);
    // Once per epoch, also when an elastic run calls this again after a
    // rank was lost in the broadcast below.
    if (end.metrics.epoch != lastSeen_) see(end.metrics.epoch, *value);
    lastSeen_ = end.metrics.epoch;
    stop = bad_ >= e.patience && !end.lastEpoch;
  }
  if (!decidedOnRankZero(trainer, stop)) return;
  if (!trainer.isWriter()) {  // its line is not shown; the numbers are rank 0's
    trainer.requestStop(fmt::format("early stopping after epoch {} (decided on rank 0)", end.metrics.epoch));
    return;
  }
  trainer.requestStop(fmt::format(
      "early stopping after epoch {}: {} has not improved by more than {:g} for {} evaluation(s) (patience {}); the "
      "best, {:.6g}, was at epoch {}",
      end.metrics.epoch, e.monitor, e.minDelta, bad_, e.patience, best_.value_or(*value), bestEpoch_));
}

}  // namespace ddp
