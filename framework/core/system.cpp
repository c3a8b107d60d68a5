#include "framework/core/system.hpp"

#include <sched.h>
#include <sys/resource.h>

#include <thread>

#include <algorithm>
#include <cstring>
#include <random>

namespace ddp {

std::string errnoText(int err) { return std::strerror(err); }

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

}  // namespace ddp
