// Small operating-system helpers shared by the layers above.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ddp {

// strerror() as a std::string, e.g. "Connection refused".
std::string errnoText(int err);

// Writes all `n` bytes to `fd`, going on after EINTR and short writes;
// returns 0, or the errno of the write that failed (ENOSPC for a write
// that wrote nothing).
int writeFully(int fd, const void* data, size_t n);

// 2 * bytes hexadecimal digits from the system's random source, for job
// tokens and names of shared-memory segments.
std::string randomHex(size_t bytes);

// The most resident memory this process has held so far (getrusage), in
// bytes.
int64_t peakResidentBytes();

// The CPUs this process may run on (its affinity mask), at least 1.
int usableCpus();

// Whether process `pid` (of this host) has exited or is exiting: gone, a
// zombie not reaped yet, or with the kernel's PF_EXITING flag (set as soon
// as it starts to exit, ~0.1 s before a killed LibTorch process is gone).
bool processExiting(int pid);

}  // namespace ddp
