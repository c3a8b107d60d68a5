// training.keep_best (best_checkpoints.hpp).
#include "framework/experiment/callbacks/best_checkpoints.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include "framework/core/append_file.hpp"
#include "framework/experiment/callbacks/monitor.hpp"
#include "framework/experiment/run_folder.hpp"
#include "framework/experiment/trainer.hpp"

namespace ddp {
namespace {

// The name a new best checkpoint of `epoch` gets.
std::string bestFileName(int64_t epoch, bool sharded) { return "best/" + checkpointFileName(epoch, 0, sharded); }

// The name of the kept one, in whichever format it was saved (the format
// may have changed on resume).
std::string keptFileName(const std::string& dir, int64_t epoch) {
  const std::string sharded = bestFileName(epoch, true);
  std::error_code ec;
  return std::filesystem::exists(dir + sharded, ec) ? sharded : bestFileName(epoch, false);
}

void removeBest(const std::string& dir, int64_t epoch) {
  std::error_code ec;
  std::filesystem::remove(dir + bestFileName(epoch, false), ec);
  std::filesystem::remove_all(dir + bestFileName(epoch, true), ec);
}

}  // namespace

void BestCheckpoints::sortKept() {
  std::stable_sort(kept_.begin(), kept_.end(), [&](const Entry& a, const Entry& b) {
    if (a.value != b.value) return maximize_ ? a.value > b.value : a.value < b.value;
    return a.epoch < b.epoch;
  });
}

void BestCheckpoints::onTrainBegin(Trainer& trainer) {
  const auto& tc = trainer.config().training;
  maximize_ = tc.keepBestMaximize;
  if (!trainer.isWriter()) return;
  const std::string dir = trainer.options().runDir + "/checkpoints/";
  std::error_code ec;
  if (trainer.startEpoch() == 0 && !trainer.options().elasticJoin) {
    // A fresh start (a restart with nothing to resume from included): an
    // earlier attempt's best checkpoints are not this run's.
    std::filesystem::remove_all(dir + "best", ec);
    restored_ = true;  // nothing to take up
    return;
  }
  restore(trainer, trainer.startEpoch());
}

void BestCheckpoints::restore(Trainer& trainer, int64_t upTo) {
  restored_ = true;
  const auto& tc = trainer.config().training;
  const std::string dir = trainer.options().runDir + "/checkpoints/";
  // Resume (or a writer that took over after a rank left): the kept files
  // that index.json lists, of epochs up to `upTo`, stay, ranked by the
  // metric now asked for (metrics.jsonl holds every epoch's values); the
  // rest go.
  std::set<int64_t> files, listed;
  for (const BestCheckpoint& b : listBestCheckpoints(trainer.options().runDir)) files.insert(b.epoch);
  for (const BestCheckpoint& b : indexedBestCheckpoints(trainer.options().runDir)) listed.insert(b.epoch);
  for (const auto& [epoch, value] : pastValues(trainer.options().runDir, tc.keepBestMonitor, upTo)) {
    if (listed.count(epoch) && std::isfinite(value) && files.erase(epoch)) kept_.push_back({epoch, value});
  }
  for (int64_t abandoned : files) removeBest(dir, abandoned);
  keepTheBest(trainer);
}

void BestCheckpoints::keepTheBest(Trainer& trainer) {
  sortKept();
  const std::string dir = trainer.options().runDir + "/checkpoints/";
  while (static_cast<int64_t>(kept_.size()) > trainer.config().training.keepBest) {
    removeBest(dir, kept_.back().epoch);
    kept_.pop_back();
  }
  writeIndex(trainer);
}

void BestCheckpoints::onEpochEnd(Trainer& trainer, EpochEnd& end) {
  const auto& tc = trainer.config().training;
  const std::optional<double> value = monitoredValue(end.metrics, tc.keepBestMonitor);
  if (!value) return;  // the same on every rank
  bool enters = false;
  if (trainer.isWriter()) {
    if (!restored_) restore(trainer, end.metrics.epoch - 1);  // took over as the writer (elastic)
    enters = static_cast<int64_t>(kept_.size()) < tc.keepBest
                 ? std::isfinite(*value)
                 : improves(*value, kept_.back().value, maximize_);
  }
  if (!decidedOnRankZero(trainer, enters)) return;
  trainer.saveCheckpointAs(bestFileName(end.metrics.epoch, trainer.config().training.checkpointFormat == "sharded"),
                           end.metrics.epoch);
  if (!trainer.isWriter()) return;
  kept_.push_back({end.metrics.epoch, *value});
  keepTheBest(trainer);
}

void BestCheckpoints::writeIndex(Trainer& trainer) const {
  const auto& tc = trainer.config().training;
  nlohmann::ordered_json index;
  index["monitor"] = tc.keepBestMonitor;
  index["mode"] = maximize_ ? "max" : "min";
  index["best"] = nlohmann::ordered_json::array();
  for (const Entry& e : kept_) {
    index["best"].push_back({{"epoch", e.epoch},
                             {"value", e.value},
                             {"file", keptFileName(trainer.options().runDir + "/checkpoints/", e.epoch)}});
  }
  std::error_code ec;
  std::filesystem::create_directories(trainer.options().runDir + "/checkpoints/best", ec);
  writeFileAtomically(trainer.options().runDir + "/checkpoints/best/index.json", index.dump(2) + "\n");
}

}  // namespace ddp
