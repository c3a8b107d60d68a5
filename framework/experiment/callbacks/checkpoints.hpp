// PeriodicCheckpoints: Trainer::saveCheckpoint() every training.save_every
// epochs and after the last epoch of the run (none when save_every is 0).
// Added on every rank: saving is collective.
#pragma once

#include "framework/experiment/callbacks/callback.hpp"

namespace ddp {

class PeriodicCheckpoints : public TrainerCallback {
 public:
  explicit PeriodicCheckpoints(int64_t every) : every_(every) {}
  void onEpochEnd(Trainer& trainer, EpochEnd& end) override;

 private:
  int64_t every_;
};

}  // namespace ddp
