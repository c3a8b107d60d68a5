// ProgressLine: rank 0's progress inside an epoch (epoch, batch, loss,
// samples/s, ETA). On an interactive terminal one line on stderr,
// rewritten after every micro-batch and cleared before the epoch's log
// line; in a log or a pipe a plain line every 10 s (so a short epoch
// prints none, and a long one is not silent; DDP_PROGRESS_SECONDS changes
// the interval).
#pragma once

#include <chrono>

#include "framework/experiment/callbacks/callback.hpp"

namespace ddp {

class ProgressLine : public TrainerCallback {
 public:
  // Whether this rank, with these options, shows one: rank 0, progress on,
  // not quiet.
  static bool wanted(const Trainer& trainer);
  explicit ProgressLine(bool live) : live_(live) {}
  // Live on a terminal (stderr), plain lines otherwise.
  static bool terminal();

  bool wantsSteps() const override { return true; }
  void onTrainBegin(Trainer& trainer) override;
  void onStepEnd(Trainer& trainer, const StepEnd& step) override;
  void onEpochEnd(Trainer& trainer, EpochEnd& end) override;

 private:
  bool live_ = true;
  std::chrono::milliseconds plainEvery_{10000};
  std::chrono::steady_clock::time_point start_, lastPlain_;
  int64_t startEpoch_ = 0;
  int64_t epochs_ = 0;
  int64_t samples_ = 0;  // trained so far in this run, all ranks
};

}  // namespace ddp
