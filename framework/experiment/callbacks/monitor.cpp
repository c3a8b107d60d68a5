// The metric that early stopping and the best checkpoints follow (monitor.hpp).
#include "framework/experiment/callbacks/monitor.hpp"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>

#include "framework/core/errors.hpp"
#include "framework/experiment/trainer.hpp"

namespace ddp {

std::optional<double> monitoredValue(const EpochMetrics& m, const std::string& monitor) {
  if (monitor == "train_loss") return m.trainLoss;
  if (monitor == "test_loss") return m.testLoss;
  if (monitor == "test_accuracy") return m.testAccuracy;
  if (monitor == "test_perplexity") return m.testPerplexity;
  if (monitor == "test_rmse") return m.testRmse;
  return std::nullopt;
}

bool improves(double value, std::optional<double> best, bool maximize, double minDelta) {
  if (!std::isfinite(value)) return false;
  if (!best) return true;
  return maximize ? value > *best + minDelta : value < *best - minDelta;
}

void checkMonitor(const std::string& setting, const std::string& monitor, Task task, int64_t testSamples) {
  if (monitor.rfind("test_", 0) == 0 && testSamples == 0) {
    fail<UsageError>("{}: {} needs a test split, and this dataset's is empty. HINT: monitor \"train_loss\", or give "
                     "the dataset a test split",
                     setting, monitor);
  }
  const bool fits = monitor == "train_loss" || monitor == "test_loss" ||
                    (monitor == "test_accuracy" && task != Task::Regression) ||
                    (monitor == "test_perplexity" && task == Task::NextToken) ||
                    (monitor == "test_rmse" && task == Task::Regression);
  if (!fits) {
    const char* instead = task == Task::Regression ? "test_loss or test_rmse"
                          : task == Task::NextToken ? "test_loss, test_perplexity or test_accuracy"
                                                    : "test_loss or test_accuracy";
    fail<UsageError>("{}: the dataset's task ({}) records no {}. HINT: monitor {}", setting, taskName(task), monitor,
                     instead);
  }
}

bool decidedOnRankZero(Trainer& trainer, bool decision) {
  if (trainer.worldSize() < 2) return decision;
  at::Tensor flag = at::full({1}, decision ? 1 : 0, at::kLong);
  trainer.group().broadcast(flag)->wait();
  return flag.item<int64_t>() != 0;
}

std::vector<std::pair<int64_t, double>> pastValues(const std::string& runDir, const std::string& monitor,
                                                   int64_t upTo) {
  std::vector<std::pair<int64_t, double>> out;
  std::ifstream in(runDir + "/metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    const auto record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!record.is_object() || !record.contains("epoch") || !record["epoch"].is_number_integer()) continue;
    const int64_t epoch = record["epoch"].get<int64_t>();
    if (epoch > upTo || !record.contains(monitor)) continue;
    // The metrics files write a NaN or an infinity as null: it counted as no
    // improvement when it happened, and does again.
    if (record[monitor].is_null()) out.emplace_back(epoch, std::nan(""));
    if (record[monitor].is_number()) out.emplace_back(epoch, record[monitor].get<double>());
  }
  return out;
}

}  // namespace ddp
