#include "backends/gloo/shm_channel.hpp"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <thread>
#include <vector>

#include "framework/core/errors.hpp"
#include "framework/core/shm_names.hpp"
#include "framework/core/system.hpp"
#include "framework/store/store.hpp"

namespace ddp {

// One cache line per rank, so that a rank's counter and its peers' waits do
// not share a line.
struct alignas(64) ShmChannel::RankHeader {
  std::atomic<uint32_t> steps;    // steps this rank has published
  std::atomic<uint32_t> waiters;  // peers asleep on `steps`
  std::atomic<uint32_t> failed;   // nonzero once this rank gave up
  int32_t pid;
};
static_assert(std::atomic<uint32_t>::is_always_lock_free, "shared-memory counters need lock-free atomics");

namespace {

using Clock = std::chrono::steady_clock;

size_t roundUp(size_t v, size_t to) { return (v + to - 1) / to * to; }

// Per-rank slot: a few MiB amortize the two barriers of a round; the whole
// segment stays small enough for a container's /dev/shm. Measured in
// docs/performance.md.
size_t slotBytesFor(int size) {
  if (const char* env = std::getenv("DDP_GLOO_SHM_SLOT_BYTES"); env && *env) {
    char* end = nullptr;
    const long long v = std::strtoll(env, &end, 10);
    if (*end != '\0' || v < 4096) {
      fail<UsageError>("DDP_GLOO_SHM_SLOT_BYTES=\"{}\": expected a number of bytes >= 4096. HINT: unset it for the "
                       "default",
                       env);
    }
    return roundUp(static_cast<size_t>(v), 4096);
  }
  const size_t budget = size_t(32) << 20;  // both sets of all ranks
  size_t slot = budget / (2 * static_cast<size_t>(size));
  slot = std::min(slot, size_t(4) << 20);
  slot = std::max(slot, size_t(256) << 10);
  return roundUp(slot, 4096);
}

size_t headerBytes(int size) {
  return roundUp(static_cast<size_t>(size) * 64 + 2 * static_cast<size_t>(size) * ShmChannel::kDescriptorBytes, 4096);
}

thread_local bool tBackgroundThread = false;  // markBackgroundThread()

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

long futexWait(std::atomic<uint32_t>* addr, uint32_t expected, std::chrono::nanoseconds timeout) {
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000000);
  ts.tv_nsec = static_cast<long>(timeout.count() % 1000000000);
  // Not FUTEX_PRIVATE: the word is shared between processes.
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futexWakeAll(std::atomic<uint32_t>* addr) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// a has reached b, counting modulo 2^32.
bool reached(uint32_t a, uint32_t b) { return static_cast<int32_t>(a - b) >= 0; }

std::string readFirstLine(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string inodeOf(const char* path) {
  struct stat st {};
  if (::stat(path, &st) != 0) return "?";
  return fmt::format("{}:{}", st.st_dev, st.st_ino);
}

}  // namespace

std::string ShmChannel::hostIdentity() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  return std::string(host) + "|" + readFirstLine("/proc/sys/kernel/random/boot_id") + "|net " +
         inodeOf("/proc/self/ns/net") + "|pid " + inodeOf("/proc/self/ns/pid") + "|shm " + inodeOf("/dev/shm");
}

void ShmChannel::checkSlotBytesVariable() { slotBytesFor(2); }

std::unique_ptr<ShmChannel> ShmChannel::connect(Store& store, int rank, int size, bool enabled,
                                                std::chrono::milliseconds timeout, std::string* why) {
  auto keyOf = [](const std::string& what, int r) { return "shm/" + what + "/" + std::to_string(r); };
  auto allKeys = [&](const std::string& what) {
    std::vector<std::string> keys;
    for (int r = 0; r < size; ++r) keys.push_back(keyOf(what, r));
    return keys;
  };
  auto setWhy = [&](const std::string& text) {
    if (why) *why = text;
  };
  if (size < 2) {
    setWhy("a single rank needs no channel");
    return nullptr;
  }

  // 1. Are all ranks on one host, and willing?
  store.setString(keyOf("host", rank), enabled ? hostIdentity() : std::string("disabled"));
  store.wait(allKeys("host"), timeout);
  const std::string mine = store.getString(keyOf("host", 0));
  for (int r = 0; r < size; ++r) {
    const std::string theirs = store.getString(keyOf("host", r));
    if (theirs == "disabled") {
      setWhy(fmt::format("shared memory is disabled on rank {}", r));
      return nullptr;
    }
    if (theirs != mine) {
      setWhy(fmt::format("rank {} runs on another host or namespace", r));
      return nullptr;
    }
  }

  // 2. Rank 0 creates the segment; the others map it; rank 0 unlinks the
  // name once all have reported, so that nothing is left in /dev/shm even
  // if a rank dies later. A store call of rank 0 that throws in between
  // unlinks it too; only a rank 0 killed in between leaves the name (its
  // pid is in it: a launcher removes it, core/shm_names.hpp).
  const size_t slot = slotBytesFor(size);
  const size_t total = headerBytes(size) + 2 * static_cast<size_t>(size) * slot;
  void* base = MAP_FAILED;
  std::string problem;
  std::string name;
  if (rank == 0) {
    name = sharedMemoryName("gloo");
    int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
      problem = "shm_open: " + errnoText(errno);
    } else {
      // posix_fallocate, not ftruncate alone: a full /dev/shm must fail
      // here, not as SIGBUS on first touch.
      int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(total));
      if (rc != 0) {
        problem = fmt::format("cannot reserve {} MiB in /dev/shm: {}", total >> 20, errnoText(rc));
      } else {
        base = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (base == MAP_FAILED) problem = "mmap: " + errnoText(errno);
      }
      ::close(fd);
    }
    if (base != MAP_FAILED) {
      auto* headers = static_cast<uint8_t*>(base);
      for (int r = 0; r < size; ++r) new (headers + 64 * r) RankHeader{{0}, {0}, {0}, 0};
    } else {
      ::shm_unlink(name.c_str());
    }
    try {
      store.setString("shm/name", base != MAP_FAILED ? name : std::string());
    } catch (...) {
      ::shm_unlink(name.c_str());
      throw;
    }
  } else {
    store.wait({"shm/name"}, timeout);
    name = store.getString("shm/name");
    if (name.empty()) {
      problem = "rank 0 could not create the segment";
    } else {
      int fd = ::shm_open(name.c_str(), O_RDWR, 0600);
      if (fd < 0) {
        problem = "shm_open: " + errnoText(errno);
      } else {
        base = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (base == MAP_FAILED) problem = "mmap: " + errnoText(errno);
        ::close(fd);
      }
    }
  }
  const std::string mapped = problem.empty() ? "ok" : problem;
  if (rank != 0) store.setString(keyOf("mapped", rank), mapped);  // rank 0's below, where a throw unlinks the name
  if (rank == 0) {
    try {
      store.setString(keyOf("mapped", rank), mapped);
      store.wait(allKeys("mapped"), timeout);
    } catch (...) {
      if (!name.empty()) ::shm_unlink(name.c_str());  // a peer gone: the name must not outlive us
      throw;
    }
    if (!name.empty()) ::shm_unlink(name.c_str());
    std::string verdict = "ok";
    for (int r = 0; r < size && verdict == "ok"; ++r) {
      const std::string got = store.getString(keyOf("mapped", r));
      if (got != "ok") verdict = fmt::format("rank {}: {}", r, got);
    }
    store.setString("shm/verdict", verdict);
  }
  store.wait({"shm/verdict"}, timeout);
  const std::string verdict = store.getString("shm/verdict");
  if (verdict != "ok") {
    if (base != MAP_FAILED) ::munmap(base, total);
    setWhy("shared memory unavailable (" + verdict + ")");
    return nullptr;
  }
  auto channel = std::unique_ptr<ShmChannel>(new ShmChannel(rank, size, slot, base, total));
  channel->header(rank).pid = static_cast<int32_t>(::getpid());
  // The PIDs must be visible before the first wait checks them.
  channel->beginRound();
  channel->step(Clock::now() + timeout);
  return channel;
}

ShmBuffer::~ShmBuffer() {
  for (uint8_t* base : bases_) {
    if (base) ::munmap(base, bytes_);
  }
}

std::shared_ptr<ShmBuffer> ShmChannel::allocateBuffer(Store& store, size_t bytes, std::chrono::milliseconds timeout,
                                                      std::string* why) {
  const uint32_t id = buffersAllocated_++;
  const std::string prefix = "shmbuf/" + std::to_string(id) + "/";
  auto keys = [&](const std::string& what) {
    std::vector<std::string> all;
    for (int r = 0; r < size_; ++r) all.push_back(prefix + what + "/" + std::to_string(r));
    return all;
  };
  auto buffer = std::shared_ptr<ShmBuffer>(new ShmBuffer(id, bytes, size_));
  auto mapNamed = [&](const std::string& name, bool create, std::string* problem) -> uint8_t* {
    int fd = ::shm_open(name.c_str(), create ? (O_CREAT | O_EXCL | O_RDWR) : O_RDWR, 0600);
    if (fd < 0) {
      *problem = fmt::format("shm_open {}: {}", name, errnoText(errno));
      return nullptr;
    }
    if (create) {
      int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
      if (rc != 0) {
        ::close(fd);
        *problem = fmt::format("cannot reserve {} bytes in /dev/shm: {}", bytes, errnoText(rc));
        return nullptr;
      }
    }
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) {
      *problem = "mmap: " + errnoText(errno);
      return nullptr;
    }
    return static_cast<uint8_t*>(p);
  };

  // Each rank creates its own segment (fresh pages: zero-filled) and names it.
  std::string problem;
  const std::string mine = sharedMemoryName("gloo-buf");
  buffer->bases_[rank_] = mapNamed(mine, /*create=*/true, &problem);
  if (!buffer->bases_[rank_]) ::shm_unlink(mine.c_str());
  // Names go once every rank has mapped (or given up): nothing is left in
  // /dev/shm, whatever happens to the processes later. A store call that
  // throws (a peer gone, the timeout) removes the name too: the segment
  // then dies with its last mapping.
  try {
    store.setString(keys("name")[rank_], problem.empty() ? mine : std::string());
    store.wait(keys("name"), timeout);
    for (int r = 0; r < size_ && problem.empty(); ++r) {
      if (r == rank_) continue;
      const std::string name = store.getString(keys("name")[r]);
      if (name.empty()) {
        problem = fmt::format("rank {} could not create its segment", r);
      } else {
        buffer->bases_[r] = mapNamed(name, /*create=*/false, &problem);
      }
    }
    store.setString(keys("mapped")[rank_], problem.empty() ? "ok" : problem);
    store.wait(keys("mapped"), timeout);
  } catch (...) {
    if (buffer->bases_[rank_]) ::shm_unlink(mine.c_str());
    throw;
  }
  if (buffer->bases_[rank_]) ::shm_unlink(mine.c_str());
  for (int r = 0; r < size_ && problem.empty(); ++r) {
    const std::string got = store.getString(keys("mapped")[r]);
    if (got != "ok") problem = fmt::format("rank {}: {}", r, got);
  }
  if (!problem.empty()) {
    if (why) *why = problem;
    return nullptr;
  }
  return buffer;
}

ShmChannel::ShmChannel(int rank, int size, size_t slotBytes, void* base, size_t mappedBytes)
    : rank_(rank), size_(size), slotBytes_(slotBytes), base_(static_cast<uint8_t*>(base)), mappedBytes_(mappedBytes) {}

ShmChannel::~ShmChannel() { ::munmap(base_, mappedBytes_); }

ShmChannel::RankHeader& ShmChannel::header(int rank) const {
  static_assert(sizeof(RankHeader) == 64, "one cache line per rank");
  return *reinterpret_cast<RankHeader*>(base_ + 64 * static_cast<size_t>(rank));
}

uint8_t* ShmChannel::descriptor(int rank) const {
  return base_ + 64 * static_cast<size_t>(size_) + (static_cast<size_t>(set_) * size_ + rank) * kDescriptorBytes;
}

uint8_t* ShmChannel::slot(int rank) const {
  return base_ + headerBytes(size_) + (static_cast<size_t>(set_) * size_ + rank) * slotBytes_;
}

void ShmChannel::markBackgroundThread() { tBackgroundThread = true; }

void ShmChannel::markFailed() {
  RankHeader& me = header(rank_);
  me.failed.store(1);
  // Wake whoever sleeps on our counter; a peer between its check and its
  // sleep sees the flag after its bounded sleep.
  futexWakeAll(&me.steps);
}

void ShmChannel::step(Deadline deadline) {
  const uint32_t target = ++steps_;
  RankHeader& me = header(rank_);
  me.steps.store(target);  // seq_cst: pairs with the waiters count below
  if (me.waiters.load() != 0) futexWakeAll(&me.steps);
  for (int peer = 0; peer < size_; ++peer) {
    if (peer != rank_) waitFor(peer, target, deadline);
  }
}

void ShmChannel::waitFor(int peer, uint32_t target, Deadline deadline) {
  RankHeader& them = header(peer);
  auto failWith = [&](const std::string& what) {
    throw ShmWaitError(fmt::format("rank {} {} (shared-memory step {})", peer, what, target));
  };
  // A peer that published the step before it failed did reach it (its
  // descriptor is there to be checked); only a missing step with the flag
  // set is its failure.
  // This rank's own flag too: set by abort() from another thread (a peer
  // known lost), it ends this wait at once.
  const RankHeader& me = header(rank_);
  auto check = [&] {
    if (reached(them.steps.load(std::memory_order_acquire), target)) return true;
    if (them.failed.load(std::memory_order_acquire)) failWith("failed");
    if (me.failed.load(std::memory_order_acquire)) {
      throw ShmWaitError(fmt::format("this rank's group was aborted while it waited for rank {} (shared-memory step {})",
                                     peer, target));
    }
    return false;
  };
  // Spin first: a peer that is running arrives within microseconds.
  for (int i = 0; i < 4000; ++i) {
    if (check()) return;
    cpuRelax();
  }
  // Then as long as setSpin() allows: a peer that is still computing
  // arrives within a fraction of a millisecond, and a rank woken from a
  // futex comes back tens of microseconds late.
  const int64_t spinNs = tBackgroundThread ? 0 : spinNs_.load(std::memory_order_relaxed);
  if (spinNs > 0) {
    const auto until = std::min<Deadline>(Clock::now() + std::chrono::nanoseconds(spinNs), deadline);
    for (;;) {
      for (int i = 0; i < 64; ++i) {
        if (check()) return;
        cpuRelax();
      }
      if (Clock::now() >= until) break;
    }
  }
  // Then yield the core, and sleep on the peer's counter. The sleep is
  // bounded so that deadline and liveness get checked.
  auto lastLiveness = Clock::now();
  for (;;) {
    if (check()) return;
    const auto now = Clock::now();
    if (now >= deadline) failWith("did not arrive before the timeout");
    if (now - lastLiveness > std::chrono::milliseconds(10)) {
      lastLiveness = now;
      if (them.pid > 0 && processExiting(them.pid)) {
        failWith(fmt::format("exited (process {} is gone)", them.pid));
      }
    }
    them.waiters.fetch_add(1);  // seq_cst: pairs with the store in step()
    const uint32_t seen = them.steps.load();
    if (!reached(seen, target) && !them.failed.load()) {
      const auto left = std::min<std::chrono::nanoseconds>(deadline - now, std::chrono::milliseconds(10));
      futexWait(&them.steps, seen, std::max<std::chrono::nanoseconds>(left, std::chrono::microseconds(50)));
    }
    them.waiters.fetch_sub(1);
  }
}

}  // namespace ddp
