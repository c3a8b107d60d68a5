#include "framework/experiment/callbacks/fault_injection.hpp"

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace ddp {

std::shared_ptr<FaultInjection> FaultInjection::fromEnvironment(int rank) {
  const char* fault = std::getenv("DDP_FAULT_INJECT");
  if (!fault) return nullptr;
  const char* restart = std::getenv("DDP_RESTART");
  if (restart && std::string(restart) != "0") return nullptr;
  int faultRank = -1;
  long long faultEpoch = -1;
  if (std::sscanf(fault, "%d:%lld", &faultRank, &faultEpoch) != 2 || faultRank != rank) return nullptr;
  return std::make_shared<FaultInjection>(faultEpoch);
}

void FaultInjection::onEpochBegin(Trainer&, int64_t epoch) {
  if (epoch == epoch_) ::raise(SIGKILL);
}

}  // namespace ddp
