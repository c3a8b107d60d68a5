// framework/core/malloc_tuning: what it sets, what it leaves to the user,
// and the page faults it saves.
#include <ATen/Parallel.h>
#include <sys/resource.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "framework/core/compute_threads.hpp"
#include "framework/core/malloc_tuning.hpp"
#include "tests/test_support.hpp"

using ddp::test::ScopedEnv;

namespace {

long minorFaults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

// The user's own choices, all unset.
struct NoUserChoice {
  std::vector<std::unique_ptr<ScopedEnv>> unset;
  NoUserChoice() {
    for (const char* name : {"DDP_MALLOC_TUNING", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_",
                             "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_", "GLIBC_TUNABLES", "LD_PRELOAD"}) {
      unset.push_back(std::make_unique<ScopedEnv>(name, nullptr));
    }
  }
};

}  // namespace

TEST_CASE("malloc tuning: the user's own allocator settings win", "[core]") {
  NoUserChoice clean;
  struct Case {
    const char* name;
    const char* value;
    const char* reason;
  };
  for (const Case& c : {Case{"DDP_MALLOC_TUNING", "0", "DDP_MALLOC_TUNING=0"},
                        Case{"MALLOC_TRIM_THRESHOLD_", "1000000", "MALLOC_TRIM_THRESHOLD_ is set"},
                        Case{"MALLOC_MMAP_THRESHOLD_", "65536", "MALLOC_MMAP_THRESHOLD_ is set"},
                        Case{"GLIBC_TUNABLES", "glibc.malloc.arena_max=2", "GLIBC_TUNABLES sets glibc.malloc"},
                        Case{"LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", "LD_PRELOAD loads jemalloc"}}) {
    INFO(c.name << "=" << c.value);
    ScopedEnv set(c.name, c.value);
    const ddp::MallocTuning result = ddp::tuneMallocForTensors();
    CHECK_FALSE(result.applied);
    CHECK(result.reason == c.reason);
  }
}

TEST_CASE("malloc tuning: a step's freed blocks are reused, not faulted in again", "[core][solo]") {
  NoUserChoice clean;
  const ddp::MallocTuning result = ddp::tuneMallocForTensors();
  if (!result.applied) {
    WARN("SKIPPED: " << result.reason);
    return;
  }
  CHECK(result.mmapThreshold == size_t{32} << 20);
  CHECK(result.trimThreshold == size_t{256} << 20);
  // A training step's tensors: allocated, written, then all freed at the
  // end of the step. With glibc's defaults (a threshold that follows the
  // freed blocks, a heap trimmed at twice it) the 16 MiB freed at once are
  // returned to the kernel and faulted in again every step: about 2,000
  // faults per step, 80,000 over 40 steps. Tuned, the first step's pages
  // are kept: about 8,000 in all.
  constexpr size_t kBlock = size_t{1} << 20;
  constexpr int kBlocks = 16, kSteps = 40;
  const long before = minorFaults();
  for (int step = 0; step < kSteps; ++step) {
    std::vector<void*> blocks(kBlocks, nullptr);
    for (void*& block : blocks) {
      REQUIRE(posix_memalign(&block, 64, kBlock) == 0);  // as LibTorch's CPU allocator
      std::memset(block, step, kBlock);
    }
    // Keep the compiler from dropping the writes.
    CHECK(static_cast<volatile unsigned char*>(blocks.back())[kBlock - 1] == static_cast<unsigned char>(step));
    for (void* block : blocks) std::free(block);
  }
  const long faults = minorFaults() - before;
  INFO(faults << " minor page faults over " << kSteps << " steps");
  CHECK(faults < 20000);
}

// framework/core/compute_threads: OpenBLAS's own pool follows the count a
// rank is given, as ATen's does (issue 44: two ranks told to use one thread
// each ran two OpenBLAS threads each on a 2-core machine).
TEST_CASE("compute threads: ATen's and OpenBLAS's pools follow setComputeThreads", "[threads][solo]") {
  const int before = at::get_num_threads();
  if (ddp::blasThreads() < 0) {
    WARN("SKIPPED: this process has no OpenBLAS (openblas_get_num_threads not found)");
    return;
  }
  const int blasBefore = ddp::blasThreads();
  ddp::setComputeThreads(1);
  CHECK(at::get_num_threads() == 1);
  CHECK(ddp::blasThreads() == 1);
  ddp::setComputeThreads(2);
  CHECK(at::get_num_threads() == 2);
  CHECK(ddp::blasThreads() == 2);
  ddp::setComputeThreads(0);  // taken as 1
  CHECK(ddp::blasThreads() == 1);
  at::set_num_threads(before);
  ddp::setComputeThreads(blasBefore);
  at::set_num_threads(before);
}
