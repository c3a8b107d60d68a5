#include "framework/experiment/callbacks/progress_line.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "framework/core/strings.hpp"
#include "framework/experiment/trainer.hpp"

namespace ddp {

bool ProgressLine::wanted(const Trainer& trainer) {
  return trainer.isWriter() && trainer.options().progress && !trainer.options().quiet && ::isatty(STDERR_FILENO);
}

void ProgressLine::onTrainBegin(Trainer& trainer) {
  start_ = std::chrono::steady_clock::now();
  startEpoch_ = trainer.startEpoch();
  epochs_ = trainer.config().training.epochs;
}

void ProgressLine::onStepEnd(Trainer& trainer, const StepEnd& step) {
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double done = (step.epoch - startEpoch_) + double(step.batch + 1) / step.batches;
  const double eta = elapsed / done * (epochs_ - startEpoch_ - done);
  // Every rank's samples: this rank's micro-batches times the world.
  samples_ += trainer.config().training.batchSize * trainer.worldSize();
  fmt::print(stderr, "\r  epoch {}/{}  batch {}/{}  loss {:.4f}  {:.0f} samples/s  ETA {}   ", step.epoch + 1, epochs_,
             step.batch + 1, step.batches, step.loss.item<double>(), double(samples_) / elapsed, formatSeconds(eta));
  std::fflush(stderr);
}

void ProgressLine::onEpochEnd(Trainer&, EpochEnd&) { fmt::print(stderr, "\r{:80}\r", ""); }

}  // namespace ddp
