#include "framework/experiment/callbacks/fault_injection.hpp"

#include "framework/core/errors.hpp"

#include <cerrno>
#include <csignal>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <filesystem>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <sstream>
#include <string>
#include <thread>

#include "framework/core/log.hpp"
#include "framework/core/system.hpp"
#include "framework/experiment/trainer.hpp"
#include "framework/launch/rank_env.hpp"

namespace ddp {

std::shared_ptr<FaultInjection> FaultInjection::fromEnvironment(int rank, std::shared_ptr<Store> store) {
  const char* fault = std::getenv("DDP_FAULT_INJECT");
  if (!fault) return nullptr;
  if (restartedByAnyLauncher(currentEnvironment())) return nullptr;
  // A rank that rejoins an elastic job is a new incarnation: no fault.
  if (const char* join = std::getenv("DDP_ELASTIC_JOIN"); join && std::string(join) == "1") return nullptr;
  std::vector<Fault> faults;
  std::stringstream entries(fault);
  std::string entry;
  while (std::getline(entries, entry, ',')) {
    int faultRank = -1;
    long long when = -1;
    char how[32] = "";
    Fault f;
    int read = 0;
    if (entry.find('@') != std::string::npos) {
      read = std::sscanf(entry.c_str(), "%d@%lld:%31s", &faultRank, &when, how);
      f.atStep = true;
    } else if (entry.find('#') != std::string::npos) {
      read = std::sscanf(entry.c_str(), "%d#%lld:%31s", &faultRank, &when, how);
      f.atEpochEnd = true;
    } else {
      read = std::sscanf(entry.c_str(), "%d:%lld:%31s", &faultRank, &when, how);
    }
    if (read < 2 || faultRank != rank) continue;
    f.when = when;
    // The action, and before it optionally "delay=MS:" (wait, then act).
    std::string action = how;
    if (action.rfind("delay=", 0) == 0) {
      f.delayMs = std::atoi(action.c_str() + 6);
      if (f.delayMs <= 0) {
        fail<UsageError>("DDP_FAULT_INJECT '{}': delay= needs a number of milliseconds above 0", entry);
      }
      const size_t colon = action.find(':');
      action = colon == std::string::npos ? "" : action.substr(colon + 1);
    }
    if (action == "stop") {
      f.signal = SIGSTOP;
    } else if (action == "term") {
      f.signal = SIGTERM;
    } else if (action.rfind("freeze=", 0) == 0) {
      f.signal = 0;  // the waker stops it (act)
      f.freezeMs = std::atoi(action.c_str() + 7);
      if (f.freezeMs <= 0) fail<UsageError>("DDP_FAULT_INJECT '{}': freeze= needs a number of milliseconds above 0", entry);
    } else if (action.rfind("sleep=", 0) == 0) {
      f.signal = 0;
      f.sleepMs = std::atoi(action.c_str() + 6);
    } else if (action == "host") {
      f.signal = SIGKILL;
      f.wholeHost = true;
    } else if (action == "until-replaced") {
      f.signal = 0;
      f.untilReplaced = true;
    } else if (!action.empty()) {
      // A fault that is not the one asked for would be measured unnoticed.
      fail<UsageError>("DDP_FAULT_INJECT '{}': unknown action '{}' (known: stop, term, sleep=MS, freeze=MS, host, "
                       "until-replaced, each optionally after delay=MS:; none: SIGKILL)",
                       entry, how);
    }
    faults.push_back(f);
  }
  if (faults.empty()) return nullptr;
  return std::make_shared<FaultInjection>(std::move(faults), std::move(store));
}

FaultInjection::FaultInjection(std::vector<Fault> faults, std::shared_ptr<Store> store)
    : faults_(std::move(faults)), store_(std::move(store)) {
  for (const Fault& f : faults_) steps_ = steps_ || f.atStep;
}

void killThisHost() {
  const pid_t launcher = ::getppid();
  const pid_t session = ::getsid(0);
  if (session != launcher) {
    logWarn("DDP_FAULT_INJECT :host: the launcher (pid {}) leads no session of its own (start it with setsid); "
            "killing it and this rank only",
            launcher);
    ::kill(launcher, SIGKILL);
    return;
  }
  logInfo("DDP_FAULT_INJECT :host: SIGKILL to every process of session {} (the launcher and its ranks)", session);
  std::error_code ignored;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ignored)) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::atol(name.c_str()));
    if (pid != ::getpid() && ::getsid(pid) == session) ::kill(pid, SIGKILL);
  }
}

void FaultInjection::act(const Fault& f) {
  if (f.delayMs > 0) std::this_thread::sleep_for(std::chrono::milliseconds(f.delayMs));
  if (f.wholeHost) killThisHost();
  if (f.freezeMs > 0) {
    // The child stops this process, wakes it MS later and exits; this one
    // waits for that exit on a pipe (closed only by the child's exit), so
    // it is stopped in between whatever the timing. Only async-signal-safe
    // calls in the child of a process with threads.
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) fail<std::runtime_error>("DDP_FAULT_INJECT :freeze: pipe: {}", errnoText(errno));
    const pid_t self = ::getpid();
    logInfo("DDP_FAULT_INJECT :freeze={}: this rank (pid {}) stops, and wakes {} ms later", f.freezeMs, self,
            f.freezeMs);
    const pid_t waker = ::fork();
    if (waker < 0) fail<std::runtime_error>("DDP_FAULT_INJECT :freeze: cannot fork the waker: {}", errnoText(errno));
    if (waker == 0) {
      ::close(fds[0]);
      ::kill(self, SIGSTOP);
      struct timespec left {f.freezeMs / 1000, static_cast<long>(f.freezeMs % 1000) * 1000000L};
      while (::nanosleep(&left, &left) != 0 && errno == EINTR) {
      }
      ::kill(self, SIGCONT);
      ::_exit(0);
    }
    ::close(fds[1]);
    char byte;
    while (::read(fds[0], &byte, 1) < 0 && errno == EINTR) {
    }
    ::close(fds[0]);
    ::waitpid(waker, nullptr, 0);
    return;
  }
  if (f.signal != 0) ::raise(f.signal);
  if (f.sleepMs > 0) std::this_thread::sleep_for(std::chrono::milliseconds(f.sleepMs));
  if (f.untilReplaced && store_) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (!store_->check({"elastic/generation"}) && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
}

void FaultInjection::onEpochBegin(Trainer&, int64_t epoch) {
  for (const Fault& f : faults_) {
    if (!f.atStep && !f.atEpochEnd && epoch == f.when) act(f);
  }
}

void FaultInjection::onEpochEnd(Trainer&, EpochEnd& end) {
  for (const Fault& f : faults_) {
    if (f.atEpochEnd && end.metrics.epoch == f.when) act(f);
  }
}

void FaultInjection::onStepEnd(Trainer&, const StepEnd& step) {
  if (!step.stepped) return;
  for (const Fault& f : faults_) {
    if (f.atStep && step.steps == f.when) act(f);
  }
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

std::shared_ptr<AwaitJoin> AwaitJoin::fromEnvironment() {
  const char* await = std::getenv("DDP_FAULT_AWAIT_JOIN");
  long long step = 0, count = 1;
  if (!await || std::sscanf(await, "%lld:%lld", &step, &count) < 1 || step <= 0) return nullptr;
  if (count < 1) fail<UsageError>("DDP_FAULT_AWAIT_JOIN '{}': STEP[:COUNT] with COUNT at least 1", await);
  if (const char* join = std::getenv("DDP_ELASTIC_JOIN"); join && std::string(join) == "1") return nullptr;
  return std::make_shared<AwaitJoin>(step, count);
}

void AwaitJoin::onStepEnd(Trainer& trainer, const StepEnd& step) {
  if (!step.stepped || step.steps != step_) return;
  const bool asked = trainer.awaitJoinRequest(std::chrono::seconds(120), count_);
  logInfo("DDP_FAULT_AWAIT_JOIN: after step {}: {}", step.steps,
          asked ? fmt::format("{} rank(s) ask to join", count_)
                : fmt::format("fewer than {} rank(s) asked to join within 120 s", count_));
}

}  // namespace ddp
