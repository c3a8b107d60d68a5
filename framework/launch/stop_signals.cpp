#include "framework/launch/stop_signals.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <stdexcept>

#include <fmt/format.h>

#include "framework/core/errors.hpp"
#include "framework/core/system.hpp"

namespace ddp {
namespace {

constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP};
constexpr int kCount = sizeof(kSignals) / sizeof(kSignals[0]);

// For the handler: the write end of the live instance's pipe, -1 if none.
volatile sig_atomic_t gWriteFd = -1;
std::atomic<bool> gInstance{false};
struct sigaction gPrevious[kCount];
bool gInstalled[kCount] = {};

void onSignal(int signal) {
  const int savedErrno = errno;
  const int fd = gWriteFd;
  if (fd >= 0) {
    const unsigned char byte = static_cast<unsigned char>(signal);
    (void)!::write(fd, &byte, 1);  // a full pipe already holds a wake-up
  }
  errno = savedErrno;
}

}  // namespace

StopSignals::StopSignals() {
  if (gInstance.exchange(true)) throw std::logic_error("StopSignals: one instance at a time");
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    gInstance = false;
    fail<std::runtime_error>("signal pipe: {}", errnoText(errno));
  }
  readFd_ = fds[0];
  writeFd_ = fds[1];
  gWriteFd = writeFd_;
  for (int i = 0; i < kCount; ++i) {
    gInstalled[i] = false;
    struct sigaction current {};
    if (::sigaction(kSignals[i], nullptr, &current) != 0 || current.sa_handler == SIG_IGN) continue;
    struct sigaction action {};
    action.sa_handler = onSignal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    if (::sigaction(kSignals[i], &action, &gPrevious[i]) == 0) gInstalled[i] = true;
  }
}

StopSignals::~StopSignals() {
  for (int i = 0; i < kCount; ++i) {
    if (gInstalled[i]) ::sigaction(kSignals[i], &gPrevious[i], nullptr);
    gInstalled[i] = false;
  }
  gWriteFd = -1;
  ::close(readFd_);
  ::close(writeFd_);
  gInstance = false;
}

int StopSignals::take() {
  int newest = 0;
  unsigned char bytes[64];
  for (;;) {
    const ssize_t n = ::read(readFd_, bytes, sizeof(bytes));
    if (n > 0) {
      newest = bytes[n - 1];
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      return newest;
    }
  }
}

std::string signalName(int signal) {
  switch (signal) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    case SIGKILL: return "SIGKILL";
    case SIGQUIT: return "SIGQUIT";
    default: return fmt::format("signal {}", signal);
  }
}

}  // namespace ddp
