// The Trainer's epoch of training steps (trainer.hpp): micro-batches, gradient accumulation,
// shadow steps for uneven shards, and the stop signals agreed between ranks.
#include <signal.h>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "framework/core/errors.hpp"
#include "framework/core/trace.hpp"
#include "framework/experiment/trainer_impl.hpp"

namespace ddp {
namespace trainer_detail {

std::atomic<int> gStopSignal{0};

namespace {

void recordStopSignal(int sig) {
  if (gStopSignal.load() != 0) {
    ::signal(sig, SIG_DFL);
    ::raise(sig);
    return;
  }
  gStopSignal.store(sig);
}

}  // namespace

StopSignals::StopSignals(bool enabled) : enabled_(enabled) {
  if (!enabled_) return;
  gStopSignal.store(0);
  struct sigaction action {};
  action.sa_handler = recordStopSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  ::sigaction(SIGTERM, &action, &oldTerm_);
  ::sigaction(SIGINT, &action, &oldInt_);
}

StopSignals::~StopSignals() {
  if (!enabled_) return;
  ::sigaction(SIGTERM, &oldTerm_, nullptr);
  ::sigaction(SIGINT, &oldInt_, nullptr);
}

}  // namespace trainer_detail

std::pair<double, double> Trainer::trainEpoch(int64_t epoch) {
  Impl& s = *impl_;
  s.model->train();
  s.epoch = epoch;
  // Without a scheduler the lr is left alone (a callback may set it).
  if (s.scheduler) {
    s.epochLrs = s.baseLrs;
    for (size_t g = 0; g < s.epochLrs.size(); ++g) s.epochLrs[g] = s.scheduler->lrAt(epoch, s.baseLrs[g]);
    applyLearningRates();
  }
  EpochSums sums;
  if (s.resumeSums.size() == 2) {
    sums.lossSum = s.resumeSums[0];
    sums.seen = static_cast<int64_t>(s.resumeSums[1]);
  }
  s.resumeSums.clear();
  s.partialEpoch = false;
  // Resumed from a checkpoint taken on a signal: the rest of that epoch,
  // from its batch count at the same world size, or (an elastic run's
  // checkpoint) from the samples the ranks had read.
  int64_t firstBatch = std::exchange(s.resumeBatch, 0);
  if (s.consumed > 0) firstBatch = 0;
  s.sampler->setEpoch(epoch + 1);
  // An elastic run goes on after a change of membership with the rest of
  // the epoch, dealt over the new world (DistributedSampler::remainderForEpoch).
  for (bool done = false; !done;) {
    try {
      done = trainSegment(epoch, firstBatch, sums);
    } catch (const std::exception& e) {
      if (!recoverable(e)) throw;
      recover(errorLine(e));
    }
    firstBatch = 0;
  }
  // An epoch stopped by a signal keeps what it read, for its checkpoint.
  if (!s.partialEpoch) s.consumed = 0;
  return {sums.lossSum, double(sums.seen)};
}

bool Trainer::trainSegment(int64_t epoch, int64_t firstBatch, EpochSums& sums) {
  Impl& s = *impl_;
  const auto& tc = config_.training;
  const auto& data = s.data;
  ParallelStrategy& strategy = *s.strategy;
  const bool warmingUp = s.warmupSteps > 0;
  const int world = worldSize();
  sums.pendingLoss = 0;  // a step that did not finish is redone
  sums.pendingSeen = 0;
  // The whole epoch's shard, or what is left of it (an elastic run's new
  // membership, or a mid-epoch checkpoint resumed at another world size).
  // A strategy that cannot shadow a rank's missing steps gets equal
  // shards of the rest.
  const bool remainder = s.consumed > 0;
  const bool join = s.join || (remainder && world > 1 && strategy.supportsJoin());
  const bool equalShards = remainder && !join;
  const bool dropLast = equalShards && tc.dropLast;
  const std::vector<int64_t> order =
      remainder ? s.sampler->remainderForEpoch(epoch, s.consumed, rank(), world, equalShards, dropLast)
                : s.sampler->indicesForEpoch(epoch);
  const auto myN = static_cast<int64_t>(order.size());
  const int64_t batches = (myN + tc.batchSize - 1) / tc.batchSize;
  const int64_t usable = tc.dropLast ? myN / tc.batchSize : batches;
  const int64_t perStep = tc.batchSize * tc.accumulateGradBatches * world;  // samples of the permutation a step reads
  if (firstBatch > 0) s.consumed = firstBatch * tc.batchSize * world;
  int64_t micro = 0;
  // Steps of this segment per rank: with unpadded shards (s.join, or a
  // remainder) a rank may have one step fewer than its peers; it shadows
  // that step. Every rank knows every rank's count, so no collective
  // decides it.
  auto stepsOf = [&](int64_t samples) {
    const int64_t b = tc.dropLast ? samples / tc.batchSize : (samples + tc.batchSize - 1) / tc.batchSize;
    return (b + tc.accumulateGradBatches - 1) / tc.accumulateGradBatches;
  };
  std::vector<int64_t> rankSteps(static_cast<size_t>(world), stepsOf(myN));
  if (join) {
    for (int q = 0; q < world; ++q) {
      rankSteps[static_cast<size_t>(q)] =
          stepsOf(remainder ? DistributedSampler::remainderSamplesFor(s.sampler->datasetSize(), s.consumed, q, world)
                            : DistributedSampler::samplesFor(s.sampler->datasetSize(), q, world, tc.dropLast,
                                                             /*pad=*/false));
    }
  }
  auto contributorsAt = [&](int64_t stepInSegment) {
    return static_cast<int>(
        std::count_if(rankSteps.begin(), rankSteps.end(), [&](int64_t n) { return n > stepInSegment; }));
  };
  const bool agreePerStep = s.watchSignals || s.rendezvous != nullptr;
  int64_t stepInEpoch = firstBatch / tc.accumulateGradBatches;
  for (int64_t b = firstBatch; b < usable && !s.stop; ++b) {
    const int64_t begin = b * tc.batchSize, len = std::min(tc.batchSize, myN - begin);
    const auto fetchStart = trainer_detail::Clock::now();
    Batch batch = data.train->get(c10::ArrayRef<int64_t>(order.data() + begin, static_cast<size_t>(len)));
    const at::Tensor x = batch.inputs.to(s.device, /*non_blocking=*/true);
    const at::Tensor y = batch.targets.to(s.device, /*non_blocking=*/true);
    const auto fetchEnd = trainer_detail::Clock::now();
    s.dataSeconds += std::chrono::duration<double>(fetchEnd - fetchStart).count();
    if (trace::enabled()) trace::record("data", trace::Track::Compute, fetchStart, fetchEnd, trace::currentStep());
    const bool stepNow = (++micro % tc.accumulateGradBatches == 0) || b == usable - 1;
    at::Tensor loss;
    {
      trace::Scope span("forward");
      at::Tensor out;
      {
        const ComputePrecision precision(s.precision, s.device.type());
        out = s.model->forward(x);
      }
      loss = s.lossFn(lossInput(out), y);
    }
    if (join && stepNow) strategy.setContributors(contributorsAt(stepInEpoch));
    {
      trace::Scope span("backward");
      strategy.backward(tc.accumulateGradBatches > 1 ? loss / double(tc.accumulateGradBatches) : loss, stepNow);
    }
    const double stepLoss = loss.item<double>();
    // Before the optimizer steps on it; an isfinite per micro-batch.
    if (!std::isfinite(stepLoss) && tc.stopOnNonfiniteLoss) {
      fail<NonFiniteLossError>("training: loss is {} at epoch {}, step {} (rank {}). HINT: lower optimizer.lr, or set "
                               "training.on_nonfinite_loss=\"continue\"",
                               trainer_detail::nonFiniteName(stepLoss), epoch + 1, s.steps + 1, rank());
    }
    if (stepNow) {
      if (warmingUp) applyLearningRates();
      {
        trace::Scope span("optimizer step");
        strategy.step();
      }
      micro = 0;
      ++s.steps;
      s.consumed += perStep;
      if (s.asyncWriter) s.asyncWriter->check();  // a failed background save fails the job here
      trace::setStep(s.steps + 1);  // the step that runs next
      ++stepInEpoch;
      if (tc.maxSteps > 0 && s.steps >= tc.maxSteps) s.stop = true;
    }
    // Counted once the step is done: a step redone after a lost rank
    // counts once.
    sums.pendingLoss += stepLoss * len;
    sums.pendingSeen += len;
    if (stepNow) {
      sums.lossSum += sums.pendingLoss;
      sums.seen += sums.pendingSeen;
      sums.pendingLoss = 0;
      sums.pendingSeen = 0;
    }
    if (!s.stepCallbacks.empty()) {
      const StepEnd step{epoch, b, usable, stepNow, s.steps, loss};
      for (TrainerCallback* callback : s.stepCallbacks) callback->onStepEnd(*this, step);
    }
    if (agreePerStep && stepNow && elasticAgreement()) {
      if (s.signal != 0) {
        s.stop = true;
        s.partialEpoch = b + 1 < usable || remainder;
        s.batchesDone = b + 1;
      } else {
        admitJoiners();
        return false;  // the rest of the epoch over the new world
      }
    }
  }
  // This rank's data is used up while its peers still have a step: it
  // shadows it (zero gradients that do not count in the average), then
  // applies the averaged gradients like everyone.
  const int64_t epochSteps = *std::max_element(rankSteps.begin(), rankSteps.end());
  for (int64_t k = std::max(stepInEpoch, stepsOf(myN)); join && k < epochSteps && !s.stop; ++k) {
    strategy.setContributors(contributorsAt(k));
    {
      trace::Scope span("shadow backward");
      strategy.shadowBackward();
    }
    if (warmingUp) applyLearningRates();
    {
      trace::Scope span("optimizer step");
      strategy.step();
    }
    ++s.steps;
    s.consumed += perStep;
    if (s.asyncWriter) s.asyncWriter->check();
    trace::setStep(s.steps + 1);
    if (tc.maxSteps > 0 && s.steps >= tc.maxSteps) s.stop = true;
    if (agreePerStep && elasticAgreement()) {
      if (s.signal != 0) {
        s.stop = true;
        s.partialEpoch = k + 1 < epochSteps || remainder;
        s.batchesDone = usable;
      } else {
        admitJoiners();
        return false;
      }
    }
  }
  return true;
}

// Every rank at each optimizer step of a run with checkpoint_on_signal: the
// largest signal number any rank got (0: none), agreed with one allreduce
// of one number, so every rank stops after the same step even when only
// some got the signal.
void Trainer::applyLearningRates() {
  Impl& s = *impl_;
  const double factor = warmupFactor(s.steps, s.warmupSteps);
  auto& groups = s.strategy->optimizer().param_groups();
  for (size_t g = 0; g < groups.size() && g < s.epochLrs.size(); ++g) {
    groups[g].options().set_lr(s.epochLrs[g] * factor);
  }
}

// Every rank after each optimizer step of a run with checkpoint_on_signal
// or --min-ranks: the largest signal number any rank got (0: none), and
// whether someone waits to join (rank 0 asks the store, at most every
// 50 ms), agreed with one allreduce of two numbers, so every rank stops or
// changes membership after the same step even when only some got the
// signal.
bool Trainer::elasticAgreement() {
  Impl& s = *impl_;
  int64_t signal = s.watchSignals ? trainer_detail::gStopSignal.load() : 0;
  int64_t join = 0;
  if (s.rendezvous && isWriter()) {
    const auto now = trainer_detail::Clock::now();
    if (now - s.lastJoinPoll >= std::chrono::milliseconds(50)) {
      s.lastJoinPoll = now;
      join = s.rendezvous->joinPending() ? 1 : 0;
    }
  }
  if (worldSize() > 1) {
    if (!s.signalFlag.defined()) s.signalFlag = at::zeros({2}, at::kLong);
    s.signalFlag.data_ptr<int64_t>()[0] = signal;
    s.signalFlag.data_ptr<int64_t>()[1] = join;
    AllreduceOptions max;
    max.op = ReduceOp::Max;
    group().allreduce(s.signalFlag, max)->wait();
    signal = s.signalFlag.data_ptr<int64_t>()[0];
    join = s.signalFlag.data_ptr<int64_t>()[1];
  }
  if (signal != 0) s.signal = static_cast<int>(signal);
  return signal != 0 || join != 0;
}

}  // namespace ddp
