// EpochLog: rank 0's line per epoch in train.log (and on stdout unless
// quiet): "epoch E/N  train_loss L[  test_loss T][  test_accuracy A]  S s".
// Runs of more than 20 epochs log only evaluation epochs and the last.
// Elastic runs: a rank that becomes the writer at an epoch's end logs that
// epoch's line unless train.log already holds it (the lost writer's).
#pragma once

#include "framework/experiment/callbacks/callback.hpp"

namespace ddp {

class EpochLog : public TrainerCallback {
 public:
  bool writerOnly() const override { return true; }
  void onEpochEnd(Trainer& trainer, EpochEnd& end) override;

 private:
  int64_t lastCalled_ = 0;  // a second call for the same epoch is a take-over
};

}  // namespace ddp
