// FaultInjection: for the launcher's tests, DDP_FAULT_INJECT="RANK:EPOCH"
// makes that rank kill itself (SIGKILL) when that epoch (0-based) begins,
// on the first attempt only (DDP_RESTART and TORCHELASTIC_RESTART_COUNT
// unset or 0); "RANK:EPOCH:stop" stops it instead (SIGSTOP: a hung rank).
// SlowRank: for the straggler report's tests, DDP_FAULT_SLOW="RANK:MS"
// makes that rank sleep MS milliseconds after each optimizer step.
#pragma once

#include <memory>

#include "framework/experiment/callbacks/callback.hpp"

namespace ddp {

class FaultInjection : public TrainerCallback {
 public:
  // The callback DDP_FAULT_INJECT asks of this rank, or null.
  static std::shared_ptr<FaultInjection> fromEnvironment(int rank);
  FaultInjection(int64_t epoch, int signal) : epoch_(epoch), signal_(signal) {}
  void onEpochBegin(Trainer&, int64_t epoch) override;

 private:
  int64_t epoch_;
  int signal_;
};

class SlowRank : public TrainerCallback {
 public:
  static std::shared_ptr<SlowRank> fromEnvironment(int rank);
  explicit SlowRank(int milliseconds) : milliseconds_(milliseconds) {}
  bool wantsSteps() const override { return true; }
  void onStepEnd(Trainer&, const StepEnd& step) override;

 private:
  int milliseconds_;
};

}  // namespace ddp
