#include "framework/experiment/callbacks/epoch_log.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
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

// The epoch of the last "epoch E/N  " line after `from` bytes (0: none).
int64_t lastLoggedEpoch(const std::string& path, uint64_t from, int64_t epochs) {
  std::ifstream in(path);
  in.seekg(static_cast<std::streamoff>(from));
  const std::string tail = fmt::format("/{}  ", epochs);
  std::string line;
  int64_t last = 0;
  while (std::getline(in, line)) {
    if (line.rfind("epoch ", 0) != 0) continue;
    char* end = nullptr;
    const long long e = std::strtoll(line.c_str() + 6, &end, 10);
    if (end != line.c_str() + 6 && line.compare(end - line.c_str(), tail.size(), tail) == 0) last = e;
  }
  return last;
}

}  // namespace

void EpochLog::onTrainBegin(Trainer& trainer) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(trainer.options().runDir + "/train.log", ec);
  logStart_ = ec ? 0 : static_cast<uint64_t>(size);
  writing_ = trainer.isWriter();
}

void EpochLog::onEpochEnd(Trainer& trainer, EpochEnd& end) {
  const int64_t epochs = trainer.config().training.epochs;
  const EpochMetrics& m = end.metrics;
  if (!(epochs <= 20 || end.evaluated || end.lastEpoch)) return;
  if (!trainer.writesEpochRecords()) return;  // a left-out writer's line would come late
  if (!writing_) {  // the writer now (elastic): the lost one may have logged this epoch
    writing_ = true;
    lastLogged_ = lastLoggedEpoch(trainer.options().runDir + "/train.log", logStart_, epochs);
  }
  if (m.epoch <= lastLogged_) return;
  lastLogged_ = m.epoch;
  std::string line = fmt::format("epoch {}/{}  train_loss {}", m.epoch, epochs, lossText(m.trainLoss));
  if (m.testLoss) line += "  test_loss " + numberText(*m.testLoss);
  if (m.testPerplexity) line += "  test_perplexity " + numberText(*m.testPerplexity);
  if (m.testAccuracy) line += "  test_accuracy " + numberText(*m.testAccuracy);
  if (m.testRmse) line += "  test_rmse " + numberText(*m.testRmse);
  line += fmt::format("  {:.3f}s", m.seconds);
  trainer.log().line(line);
}

}  // namespace ddp
