#include "framework/experiment/callbacks/epoch_log.hpp"

#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <string>

#include "framework/experiment/run_log.hpp"
#include "framework/experiment/trainer.hpp"

namespace ddp {
namespace {

// As the JSON record has it: %.8g, or null when not finite.
std::string numberText(double v) { return std::isfinite(v) ? fmt::format("{:.8g}", v) : "null"; }

// A loss with four decimals, or in scientific notation when that would be
// a wall of digits (a diverging run) or all zeros.
std::string lossText(double v) {
  if (!std::isfinite(v)) return numberText(v);
  const double a = std::abs(v);
  return (a >= 1e6 || (a > 0 && a < 1e-4)) ? fmt::format("{:.4e}", v) : fmt::format("{:.4f}", v);
}

// Whether a line of the log starts with `prefix`.
bool logHolds(const std::string& path, const std::string& prefix) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, prefix.size(), prefix) == 0) return true;
  }
  return false;
}

}  // namespace

void EpochLog::onEpochEnd(Trainer& trainer, EpochEnd& end) {
  const int64_t epochs = trainer.config().training.epochs;
  const EpochMetrics& m = end.metrics;
  const bool takeOver = m.epoch == lastCalled_;
  lastCalled_ = m.epoch;
  if (!(epochs <= 20 || end.evaluated || end.lastEpoch)) return;
  if (!trainer.writesEpochRecords()) return;  // a left-out writer's line would come late
  const std::string head = fmt::format("epoch {}/{}  ", m.epoch, epochs);
  if (takeOver && logHolds(trainer.options().runDir + "/train.log", head)) return;
  std::string line = head + "train_loss " + lossText(m.trainLoss);
  if (m.testLoss) line += "  test_loss " + numberText(*m.testLoss);
  if (m.testPerplexity) line += "  test_perplexity " + numberText(*m.testPerplexity);
  if (m.testAccuracy) line += "  test_accuracy " + numberText(*m.testAccuracy);
  if (m.testRmse) line += "  test_rmse " + numberText(*m.testRmse);
  line += fmt::format("  {:.3f}s", m.seconds);
  trainer.log().line(line);
}

}  // namespace ddp
