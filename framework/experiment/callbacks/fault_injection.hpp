// FaultInjection: for the launcher's tests, DDP_FAULT_INJECT="RANK:EPOCH"
// makes that rank kill itself (SIGKILL) when that epoch (0-based) begins,
// on the first attempt only (no launcher's restart counter above 0,
// rank_env.hpp's kRestartVariables, and not a rank rejoining an elastic job); "RANK:EPOCH:stop"
// stops it instead (SIGSTOP: a hung rank). "RANK@STEP" acts right after
// optimizer step STEP (counted from 1) instead: mid-epoch; "RANK#EPOCH"
// among the callbacks at the end of epoch EPOCH (from 1), after the
// straggler report's collective; ":sleep=MS"
// makes it sleep (a rank that hangs for a while, then wakes, its heartbeat
// beating meanwhile); ":freeze=MS" stops the whole process (SIGSTOP, its
// heartbeat too, as a cut link or a frozen host would), and a child it
// forks wakes it (SIGCONT) MS milliseconds later;
// ":until-replaced" makes it hang until the others have decided a new
// elastic membership without it ("elastic/generation" in the store), then
// wake: a hung rank that comes back late, whatever the machine's speed;
// ":host" kills its whole host at once: SIGKILL to every process of the
// launcher's session (the launcher and all its ranks), when the launcher
// leads a session of its own (a test starts it with setsid: one session,
// one simulated host); else only the launcher and this rank. "delay=MS:"
// before an action waits MS milliseconds first ("2@9:delay=300:host": the
// others are inside step 10's collective, waiting for rank 2, when its
// host dies). Several faults: a comma-separated list ("1@10,2@30").
// SlowRank: for the straggler report's tests, DDP_FAULT_SLOW="RANK:MS"
// makes that rank sleep MS milliseconds after each optimizer step.
// AwaitJoin: for the rejoin tests, DDP_FAULT_AWAIT_JOIN="STEP[:COUNT]"
// makes every member of an elastic job (not a joiner) wait after optimizer
// step STEP until COUNT ranks (1 by default) ask to join (at most 120 s), so that a restarted rank finds
// the job still running however slowly it starts: the test waits on that
// event, not on slower steps.
#pragma once

#include <csignal>
#include <memory>
#include <vector>

#include "framework/store/store.hpp"

#include "framework/experiment/callbacks/callback.hpp"

namespace ddp {

// SIGKILL to every other process of this rank's session, which the
// launcher (its parent) leads when it was started with setsid: a whole
// simulated host; to the launcher alone when it leads none. The caller
// kills itself next.
void killThisHost();

class FaultInjection : public TrainerCallback {
 public:
  // The callback DDP_FAULT_INJECT asks of this rank, or null.
  static std::shared_ptr<FaultInjection> fromEnvironment(int rank, std::shared_ptr<Store> store);
  struct Fault {
    bool atStep = false;  // when: an optimizer step (from 1), else an epoch (from 0)
    bool atEpochEnd = false;  // when: the end of an epoch (from 1), among its callbacks
    int64_t when = 0;
    int signal = SIGKILL;  // 0: none
    int sleepMs = 0;
    int freezeMs = 0;  // stopped (SIGSTOP) this many milliseconds, then woken
    bool untilReplaced = false;
    bool wholeHost = false;
    int delayMs = 0;  // before acting
  };
  FaultInjection(std::vector<Fault> faults, std::shared_ptr<Store> store);
  bool wantsSteps() const override { return steps_; }
  void onEpochBegin(Trainer&, int64_t epoch) override;
  void onStepEnd(Trainer&, const StepEnd& step) override;
  void onEpochEnd(Trainer&, EpochEnd& end) override;

 private:
  void act(const Fault& f);
  std::vector<Fault> faults_;
  std::shared_ptr<Store> store_;
  bool steps_ = false;
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

class AwaitJoin : public TrainerCallback {
 public:
  static std::shared_ptr<AwaitJoin> fromEnvironment();
  AwaitJoin(int64_t step, int64_t count) : step_(step), count_(count) {}
  bool wantsSteps() const override { return true; }
  void onStepEnd(Trainer& trainer, const StepEnd& step) override;

 private:
  int64_t step_;
  int64_t count_;
};

}  // namespace ddp
