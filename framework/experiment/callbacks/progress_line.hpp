// ProgressLine: rank 0's progress on an interactive terminal, rewritten in
// place on stderr after every micro-batch (epoch, batch, loss, ETA) and
// cleared before the epoch's log line.
#pragma once

#include <chrono>

#include "framework/experiment/callbacks/callback.hpp"

namespace ddp {

class ProgressLine : public TrainerCallback {
 public:
  // Whether this rank, with these options, shows one: rank 0, progress on,
  // not quiet, stderr a terminal.
  static bool wanted(const Trainer& trainer);

  bool wantsSteps() const override { return true; }
  void onTrainBegin(Trainer& trainer) override;
  void onStepEnd(Trainer& trainer, const StepEnd& step) override;
  void onEpochEnd(Trainer& trainer, EpochEnd& end) override;

 private:
  std::chrono::steady_clock::time_point start_;
  int64_t startEpoch_ = 0;
  int64_t epochs_ = 0;
  int64_t samples_ = 0;  // trained so far in this run, all ranks
};

}  // namespace ddp
