#include "framework/experiment/callbacks/progress_line.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <string>

#include "framework/core/strings.hpp"
#include "framework/experiment/trainer.hpp"

namespace ddp {

bool ProgressLine::wanted(const Trainer& trainer) {
  return trainer.isWriter() && trainer.options().progress && !trainer.options().quiet;
}

bool ProgressLine::terminal() { return ::isatty(STDERR_FILENO) != 0; }

void ProgressLine::onTrainBegin(Trainer& trainer) {
  start_ = lastPlain_ = std::chrono::steady_clock::now();
  // DDP_PROGRESS_SECONDS: the plain lines' interval (default 10).
  if (const char* every = std::getenv("DDP_PROGRESS_SECONDS"); every != nullptr && *every != '\0') {
    plainEvery_ = std::chrono::milliseconds(static_cast<int64_t>(std::max(0.0, std::atof(every)) * 1000));
  }
  startEpoch_ = trainer.startEpoch();
  epochs_ = trainer.config().training.epochs;
}

void ProgressLine::onStepEnd(Trainer& trainer, const StepEnd& step) {
  const auto now = std::chrono::steady_clock::now();
  // Every rank's samples: this rank's micro-batches times the world.
  samples_ += trainer.config().training.batchSize * trainer.worldSize();
  if (!live_ && now - lastPlain_ < plainEvery_) return;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double done = (step.epoch - startEpoch_) + double(step.batch + 1) / step.batches;
  const double eta = elapsed / done * (epochs_ - startEpoch_ - done);
  const std::string text = fmt::format("  epoch {}/{}  batch {}/{}  loss {:.4f}  {:.0f} samples/s  ETA {}", step.epoch + 1,
                                       epochs_, step.batch + 1, step.batches, step.loss.item<double>(),
                                       double(samples_) / elapsed, formatSeconds(eta));
  if (live_) {
    fmt::print(stderr, "\r{}   ", text);
    std::fflush(stderr);
  } else {
    lastPlain_ = now;
    fmt::print("{}\n", text);
    std::fflush(stdout);
  }
}

void ProgressLine::onEpochEnd(Trainer&, EpochEnd&) {
  if (live_) fmt::print(stderr, "\r{:80}\r", "");
}

}  // namespace ddp
