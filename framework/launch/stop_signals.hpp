// StopSignals: SIGINT, SIGTERM and SIGHUP as events of a poll() loop, for a
// launcher that must pass them on to its children instead of dying alone.
//
// Contract
// - While an instance lives, each of those signals (unless it was ignored
//   when the instance was made, as nohup ignores SIGHUP or a shell ignores
//   SIGINT in background jobs) no longer ends the process: a handler writes
//   the signal's number as one byte to a pipe whose read end is fd(), so a
//   poll() that includes fd() wakes. The handler makes only
//   async-signal-safe calls (write) and keeps errno.
// - take() returns the newest signal received since the last take(), or 0,
//   and empties the pipe. It does not block.
// - The destructor restores the previous dispositions and closes the pipe.
//   At most one instance exists at a time (it throws otherwise).
// - Children spawned meanwhile (spawnProcess) start with the default
//   dispositions, not this handler.
#pragma once

#include <string>

namespace ddp {

class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  int fd() const { return readFd_; }
  int take();

 private:
  int readFd_ = -1;
  int writeFd_ = -1;
};

// "SIGTERM", "SIGINT", ...; "signal N" for others.
std::string signalName(int signal);

}  // namespace ddp
