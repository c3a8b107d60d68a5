// EpochLog: rank 0's line per epoch in train.log (and on stdout unless
// quiet): "epoch E/N  train_loss L[  test_loss T][  test_accuracy A]  S s".
// Runs of more than 20 epochs log only evaluation epochs and the last.
// Elastic runs: a rank that becomes the writer logs the epochs whose lines
// the lost writer had not, reading back the lines of this run (those after
// train.log's size at onTrainBegin), so each epoch's line is there once.
#pragma once

#include "framework/experiment/callbacks/callback.hpp"

namespace ddp {

class EpochLog : public TrainerCallback {
 public:
  bool writerOnly() const override { return true; }
  void onTrainBegin(Trainer& trainer) override;
  void onEpochEnd(Trainer& trainer, EpochEnd& end) override;

 private:
  bool writing_ = false;    // this rank has written (or was the writer from the start)
  int64_t lastLogged_ = 0;  // the last epoch whose line train.log holds
  uint64_t logStart_ = 0;   // train.log's size when this run began
};

}  // namespace ddp
