#include "framework/experiment/callbacks/step_metrics.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "framework/comm/link_probe.hpp"
#include "framework/experiment/run_log.hpp"
#include "framework/experiment/callbacks/tensorboard_log.hpp"
#include "framework/experiment/trainer.hpp"
#include "framework/launch/rank_env.hpp"
#include "framework/parallel/strategy.hpp"

namespace ddp {
namespace {

// Six significant digits, as the metrics files keep theirs; null when not finite.
nlohmann::ordered_json finiteOrNull(double v) {
  if (!std::isfinite(v)) return nullptr;
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return std::strtod(buf, nullptr);
}

}  // namespace

void StepMetrics::onTrainBegin(Trainer& trainer) {
  restart_ = restartCount(currentEnvironment());
  runCompute_.assign(static_cast<size_t>(trainer.worldSize()), 0.0);
  runWait_.assign(static_cast<size_t>(trainer.worldSize()), 0.0);
  // Every rank knows the path: an elastic run's writer may change.
  path_ = trainer.options().runDir + "/steps.jsonl";
}

void StepMetrics::onEpochBegin(Trainer& trainer, int64_t) {
  const auto& tc = trainer.config().training;
  if (every_ == 0) {
    every_ = tc.logEvery;
    if (every_ == 0) {
      // About four records per epoch, from rank 0's share of the data.
      const int64_t samples = trainer.trainSamples() / std::max(1, trainer.worldSize());
      const int64_t steps = std::max<int64_t>(1, samples / (tc.batchSize * tc.accumulateGradBatches));
      every_ = std::max<int64_t>(1, steps / 4);
      // A run shorter than an epoch (max_steps) still gets about four.
      if (tc.maxSteps > 0) every_ = std::min(every_, std::max<int64_t>(1, tc.maxSteps / 4));
    }
  }
  epochCompute_ = epochWait_ = 0;
  stepStart_ = recordStart_ = Clock::now();
  stepsSinceRecord_ = samplesSinceRecord_ = 0;
  waitSinceRecord_ = 0;
  waitMeasured_ = true;
}

void StepMetrics::onStepEnd(Trainer& trainer, const StepEnd& step) {
  if (!step.stepped) return;
  const auto now = Clock::now();
  const double seconds = std::chrono::duration<double>(now - stepStart_).count();
  stepStart_ = now;
  const std::optional<double> wait = trainer.strategy().lastGradientWaitSeconds();
  waitMeasured_ = waitMeasured_ && wait.has_value();
  const double waited = wait.value_or(0.0);
  epochWait_ += waited;
  epochCompute_ += std::max(0.0, seconds - waited);
  const auto& tc = trainer.config().training;
  ++stepsSinceRecord_;
  samplesSinceRecord_ += tc.batchSize * tc.accumulateGradBatches * trainer.worldSize();
  waitSinceRecord_ += waited;
  // An elastic recovery may hand this rank the state of a member that got
  // a step further (it completed a step this rank did not): that step was
  // done once, but not here. Its record says so, without this rank's figures.
  const int64_t previous = lastStep_;
  lastStep_ = step.steps;
  if (trainer.isWriter() && previous >= 0) {
    for (int64_t skipped = previous + 1; skipped < step.steps; ++skipped) {
      if (skipped % every_ != 0) continue;
      nlohmann::ordered_json record;
      record["step"] = skipped;
      record["time"] = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
      record["epoch"] = step.epoch + 1;
      record["world_size"] = trainer.worldSize();
      record["loss"] = nullptr;
      record["from_state"] = "taken in an elastic recovery from the member that had done it";
      if (!file_.isOpen()) file_.open(path_, /*truncate=*/false);
      file_.append(record.dump() + "\n");
    }
  }
  if (!trainer.isWriter() || step.steps % every_ != 0) return;
  const double elapsed = std::chrono::duration<double>(now - recordStart_).count();
  nlohmann::ordered_json record;
  record["step"] = step.steps;
  // Wall-clock time (Unix seconds): steps of different processes and
  // attempts line up (an elastic recovery, a restart).
  record["time"] = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  record["epoch"] = step.epoch + 1;
  record["world_size"] = trainer.worldSize();
  record["lr"] = trainer.strategy().optimizer().param_groups().front().options().get_lr();
  record["loss"] = finiteOrNull(step.loss.item<double>());
  record["samples_per_s"] = finiteOrNull(double(samplesSinceRecord_) / elapsed);
  record["step_ms"] = finiteOrNull(elapsed * 1e3 / double(stepsSinceRecord_));
  record["comm_wait_ms"] =
      waitMeasured_ ? finiteOrNull(waitSinceRecord_ * 1e3 / double(stepsSinceRecord_)) : nlohmann::ordered_json();
  if (restart_ > 0) record["restart"] = restart_;
  // With training.clip_grad_norm: this step's global gradient norm before clipping.
  if (const std::optional<double> norm = trainer.strategy().lastGradNorm()) record["grad_norm"] = finiteOrNull(*norm);
  if (!file_.isOpen()) {
    file_.open(path_, /*truncate=*/trainer.startEpoch() == 0 && trainer.steps() <= every_ &&
                          !trainer.options().elasticJoin);
  }
  file_.append(record.dump() + "\n");
  if (tensorboard_) tensorboard_->record(trainer, "step", record, step.steps);
  recordStart_ = now;
  stepsSinceRecord_ = samplesSinceRecord_ = 0;
  waitSinceRecord_ = 0;
  waitMeasured_ = true;
}

void StepMetrics::onEpochEnd(Trainer& trainer, EpochEnd& end) {
  const int world = trainer.worldSize();
  if (world < 2) return;  // one rank has no one to wait for, nor to hold up
  at::Tensor slots = at::zeros({2 * world}, at::kDouble);  // each rank fills its two slots
  slots[trainer.rank()] = epochCompute_;
  slots[world + trainer.rank()] = epochWait_;
  trainer.group().allreduce(slots)->wait();
  const double* all = slots.data_ptr<double>();
  // An elastic run's new group (other ranks, or the same at other
  // positions): the report covers the present group's epochs.
  if (trainer.generation() != generation_ || world != static_cast<int>(hostOfRank_.size())) {
    hostOfRank_ = hostNames(trainer.group());
    generation_ = trainer.generation();
    edgeSeconds_.clear();
    epochsInGroup_ = 0;
    runCompute_.assign(static_cast<size_t>(world), 0.0);
    runWait_.assign(static_cast<size_t>(world), 0.0);
  }
  for (int r = 0; r < world; ++r) {
    const double compute = all[r], wait = all[world + r];
    end.metrics.extra.emplace_back(fmt::format("rank_{}_compute_s", r), compute);
    end.metrics.extra.emplace_back(fmt::format("rank_{}_comm_wait_s", r), wait);
    runCompute_[static_cast<size_t>(r)] += compute;
    runWait_[static_cast<size_t>(r)] += wait;
  }
  probeLinks(trainer, end);
}

void StepMetrics::probeLinks(Trainer& trainer, EpochEnd& end) {
  // The group's first 3 epochs, then every 5th: a slow link costs its
  // probe's time, so not every epoch.
  const int64_t epoch = epochsInGroup_++;
  if (epoch >= 3 && epoch % 5 != 0) return;
  const HostLinks links = probeHostLinks(trainer.group(), hostOfRank_, kLinkProbeBytes);
  if (links.edgeSeconds.empty()) return;
  edgeSeconds_.push_back(links.edgeSeconds);
  for (int e = 0; e < links.hostCount(); ++e) {
    end.metrics.extra.emplace_back(fmt::format("link_{}_mbit_s", e), links.mbitPerSecond(e));
  }
}

void StepMetrics::onTrainEnd(Trainer& trainer) {
  if (!trainer.isWriter()) return;
  reportSlowHost(trainer);
  if (runCompute_.size() < 2) return;
  const auto slowest = std::max_element(runCompute_.begin(), runCompute_.end());
  const auto fastest = std::min_element(runCompute_.begin(), runCompute_.end());
  // More than 10% slower, and by more than 0.5 s over the run: a toy run's
  // jitter, and a rank descheduled now and then on a busy machine, are no
  // straggler.
  if (*fastest <= 0 || *slowest <= 1.1 * *fastest || *slowest - *fastest <= 0.5) return;
  trainer.log().line(fmt::format(
      "straggler: rank {} computed for {:.3f} s, {:.2f}x the fastest (rank {}, {:.3f} s); the others waited for it "
      "(rank_R_compute_s and rank_R_comm_wait_s in metrics.jsonl)",
      slowest - runCompute_.begin(), *slowest, *slowest / *fastest, fastest - runCompute_.begin(), *fastest));
}

// A host whose links were slow: named when it is the slow host
// (HostLinks::slowHost) in at least 2 probes and a quarter of them, with
// the median of its links over those probes. One probe alone may catch a
// busy machine's leader descheduled; a link that slowed late in the run
// is still named.
void StepMetrics::reportSlowHost(Trainer& trainer) {
  if (edgeSeconds_.empty()) return;
  HostLinks links = HostLinks::grouped(hostOfRank_, kLinkProbeBytes);
  std::vector<int> slowIn(links.hosts.size(), 0);
  std::vector<int> verdicts;
  for (const auto& epoch : edgeSeconds_) {
    links.edgeSeconds = epoch;
    verdicts.push_back(links.slowHost());
    if (verdicts.back() >= 0) ++slowIn[static_cast<size_t>(verdicts.back())];
  }
  const int slow = static_cast<int>(std::max_element(slowIn.begin(), slowIn.end()) - slowIn.begin());
  const int count = slowIn[static_cast<size_t>(slow)];
  const int probes = static_cast<int>(edgeSeconds_.size());
  if (count < 2 || 4 * count < probes) return;
  links.edgeSeconds.clear();
  for (size_t e = 0; e < links.hosts.size(); ++e) {
    std::vector<double> times;
    for (size_t p = 0; p < edgeSeconds_.size(); ++p) {
      if (verdicts[p] == slow) times.push_back(edgeSeconds_[p].at(e));
    }
    std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
    links.edgeSeconds.push_back(times[times.size() / 2]);
  }
  trainer.log().line(fmt::format("straggler: {}; slow in {} of {} probes of the links; the others waited for it "
                                 "(link_E_mbit_s in metrics.jsonl: host E to host E + 1)",
                                 links.describeSlow(slow), count, probes));
}

}  // namespace ddp
