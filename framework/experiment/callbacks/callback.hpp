// TrainerCallback: code that the Trainer (trainer.hpp) calls at fixed points
// of a run, so that what a run records or does besides training (metrics
// files, the progress line, checkpoints, fault injection, a new metric)
// attaches without editing the loop.
//
// Contract
// - Callbacks run in the order they were added, on every rank that added
//   them, on the thread that runs the Trainer.
// - onTrainBegin: after build() and resume, before the first epoch.
//   onEpochBegin: before the epoch's first batch. onStepEnd: after every
//   micro-batch (its loss, and whether the optimizer stepped), only for
//   callbacks whose wantsSteps() is true: the hot path calls no other.
//   onEpochEnd: once the epoch's metrics are reduced over the ranks; a
//   callback may add to metrics.extra, which callbacks added after it see
//   (the metrics files write it). onTrainEnd: after the last epoch.
// - A callback that runs a collective (a checkpoint's barrier) must be
//   added on every rank, in the same order.
// - onStepEnd must not allocate or synchronise unless it needs to: it runs
//   once per micro-batch.
// - An exception from a callback ends the run with it, except in an
//   elastic run, where a failed collective in onEpochEnd makes the members
//   recover and calls that callback's onEpochEnd again (the ones before it
//   are not repeated): a callback with a collective in onEpochEnd must take
//   a second call for the same epoch (change its state once). One whose
//   onEpochEnd only writes the writer's records, with no collective
//   (writerOnly() true), is called again on a rank that a recovery makes
//   the writer, for the last epoch that ended and, when the recovery came
//   among an epoch's callbacks, for that epoch too: the lost writer may
//   have gone before it wrote them. It must skip what its files hold
//   already (reading them back once, when it starts writing), so that a
//   call for an epoch it has written writes nothing.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace ddp {

class Trainer;
struct EpochMetrics;

struct StepEnd {
  int64_t epoch = 0;    // 0-based
  int64_t batch = 0;    // 0-based, within the epoch
  int64_t batches = 0;  // batches this epoch
  bool stepped = false;  // the optimizer stepped after this micro-batch
  int64_t steps = 0;     // optimizer steps so far, resumed ones included
  const at::Tensor& loss;  // this micro-batch's (unscaled) loss
};

struct EpochEnd {
  EpochMetrics& metrics;  // epoch is 1-based
  bool evaluated = false;
  bool lastEpoch = false;  // the last one of this run (epochs or max_steps reached)
};

class TrainerCallback {
 public:
  virtual ~TrainerCallback() = default;
  virtual bool wantsSteps() const { return false; }
  virtual bool writerOnly() const { return false; }
  virtual void onTrainBegin(Trainer&) {}
  virtual void onEpochBegin(Trainer&, int64_t /*epoch, 0-based*/) {}
  virtual void onStepEnd(Trainer&, const StepEnd&) {}
  virtual void onEpochEnd(Trainer&, EpochEnd&) {}
  virtual void onTrainEnd(Trainer&) {}
};

}  // namespace ddp
