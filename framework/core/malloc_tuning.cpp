#include "framework/core/malloc_tuning.hpp"

#include <cstdlib>
#include <cstring>
#include <string>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace ddp {

namespace {

constexpr size_t kMmapThreshold = size_t{32} << 20;  // glibc's maximum on 64-bit (HEAP_MAX_SIZE / 2)
constexpr size_t kTrimThreshold = size_t{256} << 20;

const char* env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : nullptr;
}

// Why the user's own setting wins, or "".
std::string userChoice() {
  if (const char* v = env("DDP_MALLOC_TUNING"); v != nullptr && std::string(v) == "0") return "DDP_MALLOC_TUNING=0";
  for (const char* name :
       {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_"}) {
    if (env(name) != nullptr) return std::string(name) + " is set";
  }
  if (const char* v = env("GLIBC_TUNABLES"); v != nullptr && std::strstr(v, "glibc.malloc.") != nullptr) {
    return "GLIBC_TUNABLES sets glibc.malloc";
  }
  if (const char* v = env("LD_PRELOAD"); v != nullptr) {
    for (const char* allocator : {"jemalloc", "tcmalloc", "mimalloc"}) {
      if (std::strstr(v, allocator) != nullptr) return std::string("LD_PRELOAD loads ") + allocator;
    }
  }
  return "";
}

}  // namespace

MallocTuning tuneMallocForTensors() {
  MallocTuning result;
  result.reason = userChoice();
  if (!result.reason.empty()) return result;
#if defined(__GLIBC__)
  // Both, or the fix turns into its opposite: a fixed mmap threshold alone
  // leaves the trim threshold at 128 KiB (the heap shrinks after every
  // step), a trim threshold alone pins the mmap threshold at 128 KiB.
  if (mallopt(M_MMAP_THRESHOLD, static_cast<int>(kMmapThreshold)) == 1 &&
      mallopt(M_TRIM_THRESHOLD, static_cast<int>(kTrimThreshold)) == 1) {
    result.applied = true;
    result.mmapThreshold = kMmapThreshold;
    result.trimThreshold = kTrimThreshold;
  } else {
    result.reason = "mallopt refused the thresholds";
  }
#else
  result.reason = "not glibc";
#endif
  return result;
}

void returnFreedMemory() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

}  // namespace ddp
