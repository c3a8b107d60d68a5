// EpochLog: rank 0's line per epoch in train.log (and on stdout unless
// quiet): "epoch E/N  train_loss L[  test_loss T][  test_accuracy A]  S s".
// Runs of more than 20 epochs log only evaluation epochs and the last.
#pragma once

#include "framework/experiment/callbacks/callback.hpp"

namespace ddp {

class EpochLog : public TrainerCallback {
 public:
  void onEpochEnd(Trainer& trainer, EpochEnd& end) override;
};

}  // namespace ddp
