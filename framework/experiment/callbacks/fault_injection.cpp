#include "framework/experiment/callbacks/fault_injection.hpp"

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <string>
#include <thread>

namespace ddp {

std::shared_ptr<FaultInjection> FaultInjection::fromEnvironment(int rank) {
  const char* fault = std::getenv("DDP_FAULT_INJECT");
  if (!fault) return nullptr;
  for (const char* name : {"DDP_RESTART", "TORCHELASTIC_RESTART_COUNT"}) {
    const char* restart = std::getenv(name);
    if (restart && *restart && std::string(restart) != "0") return nullptr;
  }
  int faultRank = -1;
  long long faultEpoch = -1;
  char how[8] = "";
  const int read = std::sscanf(fault, "%d:%lld:%7s", &faultRank, &faultEpoch, how);
  if (read < 2 || faultRank != rank) return nullptr;
  return std::make_shared<FaultInjection>(faultEpoch, std::string(how) == "stop" ? SIGSTOP : SIGKILL);
}

void FaultInjection::onEpochBegin(Trainer&, int64_t epoch) {
  if (epoch == epoch_) ::raise(signal_);
}

std::shared_ptr<SlowRank> SlowRank::fromEnvironment(int rank) {
  const char* slow = std::getenv("DDP_FAULT_SLOW");
  int slowRank = -1, ms = 0;
  if (!slow || std::sscanf(slow, "%d:%d", &slowRank, &ms) != 2 || slowRank != rank || ms <= 0) return nullptr;
  return std::make_shared<SlowRank>(ms);
}

void SlowRank::onStepEnd(Trainer&, const StepEnd& step) {
  if (step.stepped) std::this_thread::sleep_for(std::chrono::milliseconds(milliseconds_));
}

}  // namespace ddp
