#include "framework/experiment/callbacks/metrics_files.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>

#include "framework/core/append_file.hpp"
#include "framework/experiment/callbacks/tensorboard_log.hpp"
#include "framework/experiment/trainer.hpp"

namespace ddp {
namespace {

// The task's columns between test_loss and seconds.
std::vector<std::string> taskColumns(Task task) {
  switch (task) {
    case Task::Classification: return {"test_accuracy"};
    case Task::NextToken: return {"test_perplexity", "test_accuracy"};
    case Task::Regression: return {"test_rmse"};
  }
  return {};
}

std::string csvHeader(const std::vector<std::string>& columns) {
  std::string header = "epoch,train_loss,test_loss";
  for (const std::string& c : columns) header += "," + c;
  return header + ",seconds,data_seconds,param_bytes,grad_bytes,optimizer_bytes,peak_rss_bytes\n";
}

std::optional<double> column(const EpochMetrics& m, const std::string& name) {
  if (name == "test_accuracy") return m.testAccuracy;
  if (name == "test_perplexity") return m.testPerplexity;
  if (name == "test_rmse") return m.testRmse;
  return std::nullopt;
}

// `v` as printf's `format` would print it, read back: the records keep the
// precision they always had (%.8g for losses, %.6f for seconds).
double rounded(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, v);
  return std::strtod(buf, nullptr);
}

// Every number a record holds goes through these two, so that neither file
// ever holds nan, -nan or inf (not JSON; read differently by each CSV
// reader): a value that is absent or not finite is JSON null and an empty
// CSV field. `format` is the JSON record's precision.
nlohmann::ordered_json jsonNumber(const std::optional<double>& v, const char* format = "%.8g") {
  if (!v || !std::isfinite(*v)) return nullptr;
  return rounded(format, *v);
}

std::string csvNumber(const std::optional<double>& v) {
  if (!v || !std::isfinite(*v)) return "";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%g", *v);
  return buf;
}

// The epoch of one metrics record, or -1 for a line that is not a whole
// record (the header, or the torn last line of a crashed run).
int64_t recordEpoch(const std::string& line, bool csv, size_t commas) {
  if (csv) {
    if (static_cast<size_t>(std::count(line.begin(), line.end(), ',')) != commas) return -1;
    char* end = nullptr;
    const long long epoch = std::strtoll(line.c_str(), &end, 10);
    return end != line.c_str() && *end == ',' ? epoch : -1;
  }
  const auto record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!record.is_object() || !record.contains("epoch") || !record["epoch"].is_number_integer()) return -1;
  return record["epoch"].get<int64_t>();
}

void dropMetricsAfter(const std::string& runDir, int64_t epoch, const std::string& header) {
  const auto commas = static_cast<size_t>(std::count(header.begin(), header.end(), ','));
  for (const bool csv : {false, true}) {
    const std::string path = runDir + (csv ? "/metrics.csv" : "/metrics.jsonl");
    std::ifstream in(path);
    std::string kept = csv ? header : "";
    std::string line;
    while (std::getline(in, line)) {
      const int64_t e = recordEpoch(line, csv, commas);
      if (e >= 1 && e <= epoch) kept += line + "\n";
    }
    in.close();
    writeFileAtomically(path, kept);
  }
}

// The epoch of the last whole record of a metrics file (0 without one).
int64_t lastRecordedEpoch(const std::string& path, bool csv, size_t commas) {
  std::ifstream in(path);
  std::string line;
  int64_t last = 0;
  while (std::getline(in, line)) {
    const int64_t e = recordEpoch(line, csv, commas);
    if (e >= 1) last = e;
  }
  return last;
}

}  // namespace

void MetricsFiles::onTrainBegin(Trainer& trainer) {
  const std::string& runDir = trainer.options().runDir;
  columns_ = taskColumns(trainer.task());
  // Elastic runs add this on every rank; the writer (rank 0 of the
  // current membership) writes, and one that takes over appends.
  if (!trainer.isWriter()) return;
  opened_ = true;
  const std::string header = csvHeader(columns_);
  if (trainer.options().elasticJoin) {
    // Rejoined an elastic job as its writer: the records so far stay.
  } else if (trainer.options().resume) {
    dropMetricsAfter(runDir, trainer.startEpoch(), header);
  } else {
    jsonl_.open(runDir + "/metrics.jsonl", /*truncate=*/true);
    csv_.open(runDir + "/metrics.csv", /*truncate=*/true);
    csv_.append(header);
    return;
  }
  jsonl_.open(runDir + "/metrics.jsonl");
  csv_.open(runDir + "/metrics.csv");
}

void MetricsFiles::onEpochEnd(Trainer& trainer, EpochEnd& end) {
  if (!trainer.writesEpochRecords()) return;
  const EpochMetrics& m = end.metrics;
  if (!opened_) {  // became the writer after a rank left (elastic)
    opened_ = true;
    const std::string jsonl = trainer.options().runDir + "/metrics.jsonl";
    const std::string csv = trainer.options().runDir + "/metrics.csv";
    // The lost writer may have written this epoch's records before it
    // went, or one file's and not the other's.
    const std::string header = csvHeader(columns_);
    const auto commas = static_cast<size_t>(std::count(header.begin(), header.end(), ','));
    lastJsonl_ = lastRecordedEpoch(jsonl, false, commas);
    lastCsv_ = lastRecordedEpoch(csv, true, commas);
    jsonl_.open(jsonl);
    csv_.open(csv);
  }
  if (m.epoch <= lastJsonl_ && m.epoch <= lastCsv_) return;
  nlohmann::ordered_json record;
  record["epoch"] = m.epoch;
  record["train_loss"] = jsonNumber(m.trainLoss);
  record["test_loss"] = jsonNumber(m.testLoss);
  std::string row = fmt::format("{},{},{}", m.epoch, csvNumber(m.trainLoss), csvNumber(m.testLoss));
  for (const std::string& name : columns_) {
    record[name] = jsonNumber(column(m, name));
    row += "," + csvNumber(column(m, name));
  }
  record["seconds"] = jsonNumber(m.seconds, "%.6f");
  record["data_seconds"] = jsonNumber(m.dataSeconds, "%.6f");
  record["param_bytes"] = m.parameterBytes;
  record["grad_bytes"] = m.gradientBytes;
  record["optimizer_bytes"] = m.optimizerBytes;
  record["peak_rss_bytes"] = m.peakRssBytes;
  for (const auto& [name, value] : m.extra) record[name] = jsonNumber(value);
  if (m.epoch > lastJsonl_) {
    jsonl_.append(record.dump() + "\n");
    if (tensorboard_) tensorboard_->record(trainer, "epoch", record, trainer.steps());
    lastJsonl_ = m.epoch;
  }
  if (m.epoch > lastCsv_) {
    csv_.append(row + "," + csvNumber(m.seconds) + "," + csvNumber(m.dataSeconds) +
                fmt::format(",{},{},{},{}\n", m.parameterBytes, m.gradientBytes, m.optimizerBytes, m.peakRssBytes));
    lastCsv_ = m.epoch;
  }
}

}  // namespace ddp
