#include "framework/experiment/callbacks/checkpoints.hpp"

#include "framework/experiment/trainer.hpp"

namespace ddp {

void PeriodicCheckpoints::onEpochEnd(Trainer& trainer, EpochEnd& end) {
  if (every_ > 0 && (end.metrics.epoch % every_ == 0 || end.lastEpoch)) trainer.saveCheckpoint(end.metrics.epoch);
}

}  // namespace ddp
