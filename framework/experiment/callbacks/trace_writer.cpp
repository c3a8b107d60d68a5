#include "framework/experiment/callbacks/trace_writer.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>

#include "framework/core/errors.hpp"
#include "framework/core/trace.hpp"
#include "framework/experiment/run_log.hpp"
#include "framework/experiment/trainer.hpp"
#include "framework/parallel/model_sync.hpp"

namespace ddp {
namespace {

using trace::Clock;

double microsBetween(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double, std::micro>(to - from).count();
}

// This rank's spans as Chrome-trace events, times in microseconds from
// `zero` (this rank's clock when it left the barrier).
std::string eventsOf(std::vector<trace::Span> spans, int rank, Clock::time_point zero) {
  std::stable_sort(spans.begin(), spans.end(), [](const trace::Span& a, const trace::Span& b) {
    return a.track != b.track ? a.track < b.track : a.begin < b.begin;
  });
  std::string out = "[";
  Clock::time_point streamFree{};  // the communication stream: one collective after another
  for (const trace::Span& span : spans) {
    Clock::time_point begin = span.begin;
    std::string args = fmt::format(R"("step":{})", span.step);
    if (span.track == trace::Track::Comm) {
      args += fmt::format(R"(,"launched_us":{:.3f})", microsBetween(zero, span.begin));
      begin = std::max(begin, std::min(streamFree, span.end));
      streamFree = std::max(streamFree, span.end);
    }
    if (!span.args.empty() && span.args.size() > 2) args += "," + span.args.substr(1, span.args.size() - 2);
    if (out.size() > 1) out += ",";
    out += fmt::format(R"({{"ph":"X","name":"{}","cat":"{}","pid":{},"tid":{},"ts":{:.3f},"dur":{:.3f},"args":{{{}}}}})",
                       span.name, span.track == trace::Track::Comm ? "comm" : "compute", rank,
                       static_cast<int>(span.track), microsBetween(zero, begin), microsBetween(begin, span.end), args);
  }
  return out + "]";
}

// Processes that share a boot share CLOCK_MONOTONIC (steady_clock): their
// spans need no alignment.
std::string bootId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return id;
}

bool environmentAsks() {
  const char* v = std::getenv("DDP_TRACE");
  return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
}

}  // namespace

bool TraceWriter::wanted(Trainer& trainer) {
  if (trainer.config().training.trace) return true;  // the same experiment on every rank
  const bool mine = environmentAsks();
  if (trainer.worldSize() == 1) return mine;
  at::Tensor flag = at::full({1}, mine ? 1.0 : 0.0, at::kDouble);
  trainer.group().allreduce(flag, {ReduceOp::Max})->wait();
  return flag.item<double>() > 0;
}

void TraceWriter::onTrainBegin(Trainer& trainer) {
  const auto& tc = trainer.config().training;
  // A resumed run traces from where it is, when its window has passed.
  first_ = std::max(tc.traceStart, trainer.steps() + 1);
  last_ = first_ + tc.traceSteps - 1;
  trace::setStep(trainer.steps() + 1);
  maybeStart(trainer);
}

void TraceWriter::onEpochBegin(Trainer& trainer, int64_t) { maybeStart(trainer); }

void TraceWriter::maybeStart(Trainer& trainer) {
  if (started_ || trainer.steps() + 1 != first_) return;
  started_ = true;
  trace::start(first_);
}

void TraceWriter::onStepEnd(Trainer& trainer, const StepEnd& step) {
  if (!step.stepped) return;
  if (started_ && step.steps >= last_) trace::stop();
  maybeStart(trainer);
}

void TraceWriter::onEpochEnd(Trainer& trainer, EpochEnd&) {
  // The same on every rank: the step count is.
  if (!written_ && trainer.steps() >= last_) write(trainer);
}

void TraceWriter::onTrainEnd(Trainer& trainer) {
  if (written_) return;
  if (trainer.steps() >= first_) {
    write(trainer);
  } else {
    trace::stop();
    trainer.log().line(fmt::format("trace: none written, the run ended at step {} before training.trace_start {}",
                                   trainer.steps(), first_));
  }
}

void TraceWriter::write(Trainer& trainer) {
  trace::stop();
  written_ = true;
  std::vector<trace::Span> spans = trace::takeSpans();
  // A rank that shadowed a step of the window (uneven shards) may have
  // started late: keep what each rank has.
  spans.erase(std::remove_if(spans.begin(), spans.end(),
                             [&](const trace::Span& s) { return s.step < first_ || s.step > last_; }),
              spans.end());
  const int world = trainer.worldSize();
  if (world > 1) trainer.group().barrier()->wait();
  const Clock::time_point zero = Clock::now();
  nlohmann::ordered_json header = {{"boot_id", bootId()},
                                    {"zero_us", microsBetween(Clock::time_point{}, zero)}};
  const std::string mine = header.dump() + "\n" + eventsOf(std::move(spans), trainer.rank(), zero);
  std::vector<std::string> all;
  if (world > 1) {
    all = allgatherStrings(trainer.group(), mine, trainer.group().options().timeout);
  } else {
    all.push_back(mine);
  }
  if (!trainer.isWriter()) return;
  // The peers have gone on: a file that cannot be written ends nothing.
  try {
    writeMerged(trainer, all);
  } catch (const std::exception& e) {
    trainer.log().line(fmt::format("trace: trace.json not written: {}", e.what()));
  }
}

void TraceWriter::writeMerged(Trainer& trainer, const std::vector<std::string>& all) {
  const int world = trainer.worldSize();
  nlohmann::ordered_json events = nlohmann::ordered_json::array();
  double earliest = std::numeric_limits<double>::infinity();
  // Each rank's times count from when it left the barrier. Ranks on rank
  // 0's host move onto rank 0's clock exactly; others stay aligned at the
  // barrier (off by how long its wake-up took).
  std::vector<nlohmann::ordered_json> perRank;
  nlohmann::ordered_json rank0Header;
  for (const std::string& text : all) {
    const size_t cut = text.find('\n');
    DDP_CHECK(cut != std::string::npos, "trace: a rank's spans came without their header");
    const auto header = nlohmann::ordered_json::parse(text.substr(0, cut));
    if (perRank.empty()) rank0Header = header;
    perRank.push_back(nlohmann::ordered_json::parse(text.substr(cut + 1)));
    const bool sameClock = !header["boot_id"].get<std::string>().empty() && header["boot_id"] == rank0Header["boot_id"];
    const double shift = sameClock ? header["zero_us"].get<double>() - rank0Header["zero_us"].get<double>() : 0.0;
    for (auto& e : perRank.back()) {
      e["ts"] = e["ts"].get<double>() + shift;
      if (e["args"].contains("launched_us")) e["args"]["launched_us"] = e["args"]["launched_us"].get<double>() + shift;
      earliest = std::min(earliest, e["ts"].get<double>());
    }
  }
  if (!std::isfinite(earliest)) earliest = 0;
  for (int r = 0; r < world; ++r) {
    events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", r}, {"args", {{"name", fmt::format("rank {}", r)}}}});
    events.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", r}, {"args", {{"sort_index", r}}}});
    events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", r}, {"tid", 0}, {"args", {{"name", "compute"}}}});
    events.push_back(
        {{"ph", "M"}, {"name", "thread_name"}, {"pid", r}, {"tid", 1}, {"args", {{"name", "communication"}}}});
  }
  size_t spanCount = 0;
  for (auto& rankEvents : perRank) {
    for (auto& e : rankEvents) {
      // Whole nanoseconds from the earliest span: viewers want ts >= 0.
      e["ts"] = std::round((e["ts"].get<double>() - earliest) * 1e3) / 1e3;
      if (e["args"].contains("launched_us"))
        e["args"]["launched_us"] = std::round((e["args"]["launched_us"].get<double>() - earliest) * 1e3) / 1e3;
      events.push_back(std::move(e));
      ++spanCount;
    }
  }
  const auto& config = trainer.config();
  nlohmann::ordered_json doc;
  doc["traceEvents"] = std::move(events);
  doc["displayTimeUnit"] = "ms";
  doc["otherData"] = {{"experiment", config.name},
                      {"world_size", world},
                      {"backend", config.distributed.backend},
                      {"strategy", config.distributed.strategy},
                      {"first_step", first_},
                      {"last_step", std::min(last_, trainer.steps())}};
  const std::string path = trainer.options().runDir + "/trace.json";
  {
    std::ofstream out(path, std::ios::trunc);
    out << doc.dump() << "\n";
    out.flush();
    if (!out) fail<UsageError>("cannot write {}: {}", path, std::strerror(errno));
  }
  trainer.log().line(fmt::format("trace: steps {}-{} of {} rank(s), {} spans in {} (open it in ui.perfetto.dev or "
                                 "chrome://tracing)",
                                 first_, std::min(last_, trainer.steps()), world, spanCount, path));
}

}  // namespace ddp
