// ProcessGroupGloo::Impl: the machinery behind ProcessGroupGloo, shared by
// the files of backends/gloo/ and by nothing else.
//
// - The queue: enqueue() numbers a collective (its sequence number), logs
//   it at DDP_LOG_LEVEL=debug and hands it to one worker thread, which runs
//   the collectives in call order. A collective that fails breaks the group:
//   every later one fails at once, naming the first failure.
// - The transport, chosen once per collective by pathFor() when it is
//   queued: Local (one rank), Shm (all ranks share a host: shm), Frame (the
//   payload fits the frame every TCP collective starts with: frames),
//   Large (an empty frame, then the ring: ring.hpp; a barrier above
//   FrameExchange::kAllToAllMaxRanks ranks too). ShmInPlace is an
//   allreduce on a communication buffer. alltoall takes Shm, Frame (its
//   splits in the frames, then its blocks straight over the frames' mesh)
//   or, above kAllToAllMaxRanks ranks, PointToPoint: messages between each
//   pair of ranks (framework/comm/point_to_point.hpp), run on the worker in
//   call order.
// - Small collectives in the caller: when nothing is queued or running, a
//   Local collective, or a shared-memory or Frame one of at most
//   kInlineMaxBytes per rank (DDP_GLOO_INLINE_BYTES overrides; 0 turns it
//   off), runs on the calling thread and returns a completed Work. Waking
//   the worker and then the waiter costs more than such a collective (over
//   loopback TCP, a 4 KiB allreduce took about 110 us more). The caller
//   then waits for its peers itself, as it would in wait(). Call order is kept: a
//   call made while one runs is queued, and the worker starts it only when
//   the running one has finished.
// - A shared-memory collective run in the caller spins up to callerSpin()
//   for its peers before it sleeps: the caller has nothing else to do, and
//   a sleeping rank wakes tens of microseconds late (docs/performance.md,
//   the cnn step). On the worker, which shares a core with the training
//   loop, waits spin only briefly.
// Everything here but enqueue() belongs to whichever thread runs a
// collective (running_ says one does) once the constructor has finished.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "backends/gloo/descriptor.hpp"
#include "backends/gloo/frames.hpp"
#include "backends/gloo/host_tensors.hpp"
#include "backends/gloo/process_group_gloo.hpp"
#include "backends/gloo/ring.hpp"
#include "backends/gloo/shm_collectives.hpp"
#include "framework/comm/point_to_point.hpp"

namespace ddp {

struct ProcessGroupGloo::Impl {
  using Descriptor = gloo_backend::Descriptor;
  using Deadline = gloo_backend::Deadline;
  using Run = std::function<void(const Descriptor&, Deadline)>;
  enum class Path { Local, Shm, ShmInPlace, Frame, Large, PointToPoint };

  Impl(int rank, int size) : rank(rank), size(size) {}
  // Stops the worker after the queued collectives, agrees with the peers
  // that all are done, then drops the connections.
  ~Impl();

  // How a collective with `payloadBytes` per rank moves its data.
  Path pathFor(size_t payloadBytes) const;
  // Queues `run` as collective `descriptor` (its seq is filled in here).
  // `payloadBytes` decides whether it may run in the caller; default: the
  // descriptor's element count times its element size.
  WorkPtr enqueue(Descriptor descriptor, const std::string& summary, Milliseconds timeout, Path path, Run run,
                  std::optional<size_t> payloadBytes = std::nullopt);
  void startWorker();
  // Measured in docs/performance.md (issue 13's cnn step).
  static constexpr size_t kInlineMaxBytes = 256 * 1024;
  // kInlineMaxBytes or DDP_GLOO_INLINE_BYTES (UsageError when malformed).
  static size_t inlineMaxBytes();
  // How long a shared-memory wait in the caller spins: DDP_GLOO_SPIN_US,
  // else 1 ms when every local rank can have a CPU of its own (`localRanks`
  // <= usable CPUs), else 0. UsageError when the variable is malformed.
  static std::chrono::microseconds callerSpin(int localRanks);
  // ProcessGroupGloo::abort.
  void abort(const std::string& reason);
  // Breaks this rank's group as a collective's timeout does: later
  // collectives fail at once with `reason`; peers on this host stop
  // waiting for it (shared memory), the TCP connections stay open.
  void markBroken(const std::string& reason);
  // The first failure, once the group is broken; else null.
  std::exception_ptr failure();
  // Set when the group is being destroyed: a send or recv that fails then
  // does not break it (p2p's failure hook, process_group_gloo.cpp).
  std::atomic<bool> closing{false};

  const int rank, size;
  std::shared_ptr<Store> store;  // "gloo/"-prefixed; also used to close in step
  std::string listenAddress;     // Gloo's description of the TCP device that chose the address
  std::string shmWhyNot;
  // The transports; the ones a group does not use stay null; destroyed in
  // ~Impl's order. Gloo's device only picked the address: frames and ring
  // have their own connections (framework/comm/links.hpp).
  std::unique_ptr<gloo_backend::FrameExchange> frames;  // size > 1, no shared memory
  std::unique_ptr<gloo_backend::Ring> ring;             // likewise
  std::unique_ptr<gloo_backend::ShmCollectives> shm;
  // reduce_scatter's partial sums on the ring, reused: a fresh 64 MiB
  // buffer per call costs page faults.
  std::vector<uint8_t> reduceScatterIn;
  std::chrono::microseconds shmCallerSpin{0};  // callerSpin(size), when shm
  // send/recv: connections of their own, made on first use (size > 1).
  std::unique_ptr<PointToPoint> p2p;

 private:
  struct Task {
    Descriptor descriptor;
    WorkPtr work;
    Deadline deadline;
    Milliseconds timeout;
    Run run;
  };
  void workerLoop();
  bool runsInline(Path path, size_t payloadBytes) const;
  // Runs one collective (on the worker's or the caller's thread, one at a
  // time) and returns its error, if any; the Work is finished by the caller
  // of runTask once running_ is cleared.
  std::exception_ptr runTask(Task& task);

  std::mutex mutex_;
  std::condition_variable queued_;
  std::deque<Task> queue_;
  std::atomic<int> queuedCount_{0};  // queue_.size(), for polling without the lock
  bool stopping_ = false;
  bool running_ = false;  // a collective is running (worker or caller)
  uint64_t nextSeq_ = 0;
  std::exception_ptr broken_;  // first failure; later collectives fail with it (under mutex_)
  std::thread worker_;
};

}  // namespace ddp
