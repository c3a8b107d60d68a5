// Names of the POSIX shared-memory segments that ddp creates, and the
// removal of those a killed process left behind.
//
// Contract
// - sharedMemoryName("gloo-buf") is "/ddp-gloo-buf-<pid>-<16 hex digits>":
//   the creating process's pid is the second-to-last field, so that whoever
//   outlives a killed creator can find what it left. Every segment that ddp
//   creates is named by it.
// - Creators unlink a name as soon as every peer has opened it; a name stays
//   in /dev/shm only when its creator died in between (SIGKILL, or a signal
//   whose default action ends it).
// - removeSharedMemoryOf(pids) unlinks every /dev/shm entry so named whose
//   pid is one of `pids`, and returns the names it removed. Call it once
//   those processes are reaped (a launcher, after its ranks): a pid still
//   running may still be setting its segments up.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace ddp {

std::string sharedMemoryName(const std::string& kind);

std::vector<std::string> removeSharedMemoryOf(const std::vector<pid_t>& pids);

}  // namespace ddp
