// ShmChannel: the same-host path of ProcessGroupGloo.
//
// When every rank of a group runs on one host (same boot, same network,
// PID and /dev/shm namespaces), the ranks map one POSIX shared-memory
// segment and move payloads through it instead of through loopback TCP.
// A loopback TCP stream copies every byte twice through the kernel and
// wakes the receiver per message; here a rank copies its data in once, the
// ranks reduce disjoint regions in parallel, and each copies the result out.
//
// Protocol. Every rank performs the same sequence of rounds. A round uses
// one of two slot sets (alternating), holds one slot of slotBytes() per rank
// and contains at least one step(). step() publishes this rank's step count
// and waits until every rank has published it: a barrier. Since the next
// round contains a barrier too, nobody writes into a set again before every
// rank has finished reading it two rounds earlier. Between beginRound() and
// the first step() a rank may write only its own slot and descriptor.
//
// Waits spin briefly (about 4000 pause instructions), then for as long as
// setSpin() allows, then sleep on a futex. Waking a sleeping rank costs
// tens of microseconds (far more in a virtual machine), so a caller with a
// core to itself spins longer; a worker thread that shares its core with
// the training loop does not. They fail (ShmWaitError) when
// the deadline passes, when a peer marked itself failed, or when a peer's
// process no longer exists, so a dead peer never hangs the group.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddp {

class Store;

class ShmWaitError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Memory that every rank of a channel reads and writes: one segment per
// rank, mapped by all. Unmapped when the last reference goes.
class ShmBuffer {
 public:
  ~ShmBuffer();
  ShmBuffer(const ShmBuffer&) = delete;
  ShmBuffer& operator=(const ShmBuffer&) = delete;
  uint8_t* base(int rank) const { return bases_[rank]; }
  size_t bytes() const { return bytes_; }
  uint32_t id() const { return id_; }  // the same on every rank

 private:
  friend class ShmChannel;
  ShmBuffer(uint32_t id, size_t bytes, int size) : id_(id), bytes_(bytes), bases_(size, nullptr) {}
  uint32_t id_;
  size_t bytes_;
  std::vector<uint8_t*> bases_;
};

class ShmChannel {
 public:
  using Deadline = std::chrono::steady_clock::time_point;
  static constexpr size_t kDescriptorBytes = 64;

  // Collective over `store`: every rank of the group calls it, and every
  // rank gets a channel, or every rank gets null (ranks on several hosts,
  // `enabled` false on any rank, or shared memory unavailable). `why`
  // receives the reason for null.
  static std::unique_ptr<ShmChannel> connect(Store& store, int rank, int size, bool enabled,
                                             std::chrono::milliseconds timeout, std::string* why);
  // Throws UsageError when DDP_GLOO_SHM_SLOT_BYTES is set but not a size
  // (a number >= 4096). Local: call it before any store traffic.
  static void checkSlotBytesVariable();
  ~ShmChannel();
  ShmChannel(const ShmChannel&) = delete;
  ShmChannel& operator=(const ShmChannel&) = delete;

  size_t slotBytes() const { return slotBytes_; }
  // Switches to the other slot set.
  void beginRound() { set_ ^= 1; }
  uint8_t* slot(int rank) const;
  uint8_t* descriptor(int rank) const;
  // Publishes this rank's next step and waits for all ranks to reach it.
  void step(Deadline deadline);
  // Tells the peers that this rank failed, so that they stop waiting.
  void markFailed();
  // How long the next waits spin, beyond the brief spin, before they sleep.
  // Any thread may set it; it applies from the next wait on, except on a
  // thread marked by markBackgroundThread().
  void setSpin(std::chrono::nanoseconds spin) { spinNs_.store(spin.count(), std::memory_order_relaxed); }
  // Marks the calling thread as a background one (a backend's worker, which
  // shares a core with the training loop): its waits spin only briefly,
  // whatever setSpin() says, also when it runs a collective of another
  // group in place (a hierarchical group's steps, a comm hook's next stage).
  static void markBackgroundThread();

  // Collective over `store`, in the same order on every rank: a buffer of
  // `bytes` per rank that all ranks map, zero-filled. Every rank gets one,
  // or every rank gets null (`why` says why).
  std::shared_ptr<ShmBuffer> allocateBuffer(Store& store, size_t bytes, std::chrono::milliseconds timeout,
                                            std::string* why);

  // Identifies the host and the namespaces that decide whether two
  // processes can share a segment and see each other's PIDs.
  static std::string hostIdentity();

 private:
  struct RankHeader;
  ShmChannel(int rank, int size, size_t slotBytes, void* base, size_t mappedBytes);
  RankHeader& header(int rank) const;
  void waitFor(int peer, uint32_t target, Deadline deadline);

  int rank_, size_;
  size_t slotBytes_;
  uint8_t* base_;
  size_t mappedBytes_;
  int set_ = 1;  // the first beginRound() selects set 0
  uint32_t steps_ = 0;
  uint32_t buffersAllocated_ = 0;
  std::atomic<int64_t> spinNs_{0};
};

}  // namespace ddp
