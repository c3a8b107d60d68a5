#include "framework/core/system.hpp"

#include <cerrno>
#include <cstdio>
#include <csignal>
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <thread>

#include <algorithm>
#include <cstring>
#include <random>

namespace ddp {

std::string errnoText(int err) { return std::strerror(err); }

int writeFully(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, std::min<size_t>(n, size_t{1} << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (w == 0) return ENOSPC;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return 0;
}

std::string randomHex(size_t bytes) {
  static const char digits[] = "0123456789abcdef";
  std::random_device device;  // /dev/urandom on Linux
  std::string text;
  text.reserve(2 * bytes);
  for (size_t i = 0; i < bytes; ++i) {
    const unsigned value = device() & 0xffu;
    text += digits[value >> 4];
    text += digits[value & 0xf];
  }
  return text;
}

int64_t peakResidentBytes() {
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

int usableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

bool processExiting(int pid) {
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return false;
  char buffer[512];
  const size_t n = std::fread(buffer, 1, sizeof(buffer) - 1, f);
  std::fclose(f);
  buffer[n] = '\0';
  const char* close = std::strrchr(buffer, ')');  // the fields follow the command name in parentheses
  if (close == nullptr || close[1] != ' ') return false;
  if (close[2] == 'Z' || close[2] == 'X') return true;
  // Field 9, the kernel's task flags: PF_EXITING (0x4) is set as soon as
  // the process starts to exit, well before its memory is torn down (a
  // killed LibTorch process takes ~0.1 s to disappear).
  unsigned long flags = 0;
  if (std::sscanf(close + 2, "%*c %*d %*d %*d %*d %*d %lu", &flags) != 1) return false;
  return (flags & 0x4UL) != 0;
}

}  // namespace ddp
