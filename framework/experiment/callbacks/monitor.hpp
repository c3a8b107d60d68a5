// Monitor: a metric of the epoch records that a policy follows (early
// stopping, the best checkpoints), and what the policies share.
//
// Contract
// - monitoredValue(): the metric's value in one epoch's record (the names
//   of monitorNames(), experiment_config.hpp), nullopt on an epoch that
//   has none (a test metric on an epoch without evaluation). The value is
//   the same on every rank (the trainer reduces it before the callbacks).
// - improves(): a finite value better than `best` by more than minDelta
//   (lower for min, higher for max); the first finite value improves on
//   none. NaN and infinities never improve.
// - checkMonitor(): UsageError, one line naming the setting and the
//   dataset's task, when the task never records that metric (test_rmse
//   for classification, test_perplexity off next-token data) or the test
//   split is empty; the trainer checks before the run folder exists.
// - decidedOnRankZero(): rank 0's decision, broadcast, so that every rank
//   acts on the same one whatever rounding the others saw (one broadcast of
//   one number; none on one rank).
// - pastValues(): rank 0 on resume, from runDir/metrics.jsonl: the
//   metric's values of epochs up to `upTo`, in order (NaN where the record
//   holds null: a non-finite value), so a policy's state continues where
//   the checkpoint left it. Values come back as the files hold them (8
//   significant digits).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "framework/experiment/plugin_registry.hpp"

namespace ddp {

class Trainer;
struct EpochMetrics;

std::optional<double> monitoredValue(const EpochMetrics& metrics, const std::string& monitor);
bool improves(double value, std::optional<double> best, bool maximize, double minDelta = 0);
void checkMonitor(const std::string& setting, const std::string& monitor, Task task, int64_t testSamples);
bool decidedOnRankZero(Trainer& trainer, bool decision);
std::vector<std::pair<int64_t, double>> pastValues(const std::string& runDir, const std::string& monitor,
                                                   int64_t upTo);

}  // namespace ddp
