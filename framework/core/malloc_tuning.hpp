// glibc's malloc, set for tensors: blocks of a training step stay mapped.
//
// LibTorch allocates CPU tensors with posix_memalign and frees them when the
// last reference goes. With glibc's defaults a block over M_MMAP_THRESHOLD
// (128 KiB, raised only by its own heuristic) is a fresh mmap, and a heap
// whose free top exceeds M_TRIM_THRESHOLD is shrunk, so a step's activations
// and gradients (hundreds of KiB to MiB each) go back to the kernel when
// they die and are page-faulted in again, page by page, on the next step.
// On the char_gpt model that was a quarter of the step (forward 88 -> 70 ms,
// backward 101 -> 75 ms, minor faults 252k -> 149k; docs/performance.md).
//
// Contract
// - tuneMallocForTensors() sets M_MMAP_THRESHOLD to 32 MiB (glibc's largest
//   value: bigger blocks are still mapped and unmapped on their own) and
//   M_TRIM_THRESHOLD to 256 MiB (up to that much freed heap stays with the
//   process). Peak resident memory is unchanged; memory freed after the
//   peak returns to the kernel later or not at all.
// - It changes nothing, and says why in the result, when the user chose:
//   DDP_MALLOC_TUNING=0, any of glibc's MALLOC_MMAP_THRESHOLD_,
//   MALLOC_TRIM_THRESHOLD_, MALLOC_TOP_PAD_, MALLOC_MMAP_MAX_ or a
//   glibc.malloc tunable in GLIBC_TUNABLES; another allocator preloaded
//   (LD_PRELOAD naming jemalloc, tcmalloc or mimalloc); or not glibc.
// - Process-wide and idempotent: ddp-run calls it in every process that
//   trains (a rank, a one-process run; not the launcher, --export or
//   --sample, which stream tensors and would only keep freed blocks);
//   ddp-bench first thing in main(); a program that embeds the Trainer
//   calls it itself.
#pragma once

#include <cstddef>
#include <string>

namespace ddp {

struct MallocTuning {
  bool applied = false;
  std::string reason;  // when not applied: why (the variable that chose otherwise)
  size_t mmapThreshold = 0;
  size_t trimThreshold = 0;
};

MallocTuning tuneMallocForTensors();

// Gives the free memory inside the heap back to the kernel (glibc's
// malloc_trim; nothing elsewhere), for a moment when much was freed and
// will not be needed again: a sharded strategy just built, which replaced
// the model's own parameters by views of its buffers.
void returnFreedMemory();

}  // namespace ddp
