// ProcessGroupGloo::Impl's queue and worker thread (impl.hpp).

#include <c10/core/ScalarType.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <future>
#include <limits>
#include <optional>
#include <thread>
#include <vector>

#include "backends/gloo/impl.hpp"
#include "backends/gloo/shm_channel.hpp"
#include "framework/core/errors.hpp"
#include "framework/core/help_links.hpp"
#include "framework/core/log.hpp"
#include "framework/core/system.hpp"

namespace ddp {
namespace {

// A tuning variable holding a whole number in [min, max]: nullopt when
// unset or empty; a UsageError `NAME="VALUE": <expected>` when malformed.
std::optional<long long> tuningInteger(const char* name, long long min, long long max, const std::string& expected) {
  const char* env = std::getenv(name);
  if (env == nullptr || *env == '\0') return std::nullopt;
  char* end = nullptr;
  const long long v = std::strtoll(env, &end, 10);
  if (*end != '\0' || v < min || v > max) fail<UsageError>("{}=\"{}\": {}", name, env, expected);
  return v;
}

const char* pathName(ProcessGroupGloo::Impl::Path path, uint32_t op) {
  using Path = ProcessGroupGloo::Impl::Path;
  switch (path) {
    case Path::Local: return "local";
    case Path::Shm: return "shm";
    case Path::ShmInPlace: return "shm in place";
    case Path::Frame: return "frame";
    case Path::Large:
      return op == gloo_backend::kAllreduce || op == gloo_backend::kReduceScatter ? "ring" : "gloo";
    case Path::PointToPoint: return "point to point";
  }
  return "?";
}

}  // namespace

ProcessGroupGloo::Impl::Path ProcessGroupGloo::Impl::pathFor(size_t payloadBytes) const {
  if (size == 1) return Path::Local;
  if (shm) return Path::Shm;
  return gloo_backend::FrameExchange::fits(payloadBytes, size) ? Path::Frame : Path::Large;
}

void ProcessGroupGloo::Impl::startWorker() {
  worker_ = std::thread([this] {
    ShmChannel::markBackgroundThread();
    workerLoop();
  });
}

ProcessGroupGloo::Impl::~Impl() {
  const bool started = worker_.joinable();  // false: the constructor failed
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  queued_.notify_all();
  if (worker_.joinable()) worker_.join();
  // A rank that closes its connections while a peer still waits for the end
  // of the last collective would fail that peer ("connection closed by
  // peer"): healthy groups first agree through the store that all are done.
  // A broken rank (a timeout, an abort, a failed collective) may have
  // failed because a peer is stopped or hung, and that peer may serve the
  // store: a store call would then wait out the store's timeout too,
  // delaying this rank's error by as much again. So a broken rank sets its
  // closing key from a thread of its own (holding the store), waited for at
  // most 1 s: healthy peers still learn it, a hung server delays nobody.
  // A group destroyed while an exception unwinds (the rank failed outside
  // a collective: a checkpoint it could not write) counts as broken too: its
  // peers wait inside a collective that this rank will never join, and
  // would never set their keys; its launcher stops them once it has ended.
  bool broken = std::uncaught_exceptions() > 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    broken = broken || broken_ != nullptr;
  }
  if (started && size > 1 && broken) {
    try {
      auto said = std::make_shared<std::promise<void>>();
      std::future<void> saidFuture = said->get_future();
      std::thread([store = store, key = fmt::format("closed/{}", rank), said] {
        try {
          store->setString(key, "1");
        } catch (...) {
          // The store is gone or hung: nobody to tell.
        }
        said->set_value();
      }).detach();
      saidFuture.wait_for(std::chrono::seconds(1));
    } catch (...) {
      // No thread to spare: the peers wait for the key until their bound.
    }
  } else if (started && size > 1) {
    try {
      std::vector<std::string> keys;
      for (int r = 0; r < size; ++r) keys.push_back(fmt::format("closed/{}", r));
      store->setString(keys[rank], "1");
      store->wait(keys, std::chrono::milliseconds(10000));
    } catch (const std::exception&) {
      // A peer that is gone cannot be waited for; close anyway.
    }
  }
  // The connections, then the memory.
  frames.reset();
  ring.reset();
  shm.reset();
}

size_t ProcessGroupGloo::Impl::inlineMaxBytes() {
  static const size_t bytes = [] {
    const size_t fallback = ProcessGroupGloo::Impl::kInlineMaxBytes;
    const auto v = tuningInteger("DDP_GLOO_INLINE_BYTES", 0, std::numeric_limits<long long>::max(),
                                 fmt::format("expected a number of bytes >= 0 (0: every collective goes through the "
                                             "worker thread). HINT: unset it for the default, {}",
                                             fallback));
    return v ? static_cast<size_t>(*v) : fallback;
  }();
  return bytes;
}

std::chrono::microseconds ProcessGroupGloo::Impl::callerSpin(int localRanks) {
  const auto v = tuningInteger("DDP_GLOO_SPIN_US", 0, 10'000'000,
                               "expected microseconds from 0 to 10000000 that a small shared-memory collective spins "
                               "for its peers before sleeping. HINT: unset it for the default (1000 when every rank "
                               "has a CPU of its own, else 0)");
  if (v) return std::chrono::microseconds(*v);
  return localRanks <= usableCpus() ? std::chrono::microseconds(1000) : std::chrono::microseconds(0);
}

bool ProcessGroupGloo::Impl::runsInline(Path path, size_t bytes) const {
  if (path == Path::Local) return true;
  if (path != Path::Shm && path != Path::ShmInPlace && path != Path::Frame) return false;
  const size_t limit = inlineMaxBytes();
  return limit > 0 && bytes <= limit;  // 0: nothing in the caller, not even a barrier
}

WorkPtr ProcessGroupGloo::Impl::enqueue(Descriptor descriptor, const std::string& summary, Milliseconds timeout,
                                        Path path, Run run, std::optional<size_t> payloadBytes) {
  const size_t bytes = payloadBytes ? *payloadBytes
                                    : static_cast<size_t>(std::max<int64_t>(descriptor.numel, 0)) *
                                          c10::elementSize(static_cast<c10::ScalarType>(descriptor.dtype));
  std::unique_lock<std::mutex> lock(mutex_);
  descriptor.seq = nextSeq_++;
  auto work = std::make_shared<Work>(gloo_backend::describeCall(rank, size, descriptor, summary), timeout);
  Task task{descriptor, work, gloo_backend::Clock::now() + timeout, timeout, std::move(run)};
  if (queue_.empty() && !running_ && runsInline(path, bytes)) {
    // Nothing is queued or running, so this collective is next in call
    // order: the caller runs it, sparing two thread hand-offs (queue to
    // worker, worker to waiter) that cost more than a small collective.
    running_ = true;
    lock.unlock();
    logDebug("{} runs in the caller, path {}", work->description(), pathName(path, descriptor.op));
    // Reset before running_ is cleared, so no worker task sees the spin.
    const bool spins = shm && shmCallerSpin.count() > 0 && (path == Path::Shm || path == Path::ShmInPlace);
    if (spins) shm->setSpin(shmCallerSpin);
    std::exception_ptr error;
    try {
      error = runTask(task);
    } catch (...) {
      if (spins) shm->setSpin(std::chrono::nanoseconds(0));
      throw;
    }
    if (spins) shm->setSpin(std::chrono::nanoseconds(0));
    lock.lock();
    running_ = false;
    // The worker waits for running_ when a call was queued meanwhile; when
    // none was, it is not woken (a wake-up per call took CPU time from
    // the training loop).
    const bool wake = !queue_.empty();
    lock.unlock();
    if (wake) queued_.notify_one();
    work->finish(error);
    return work;
  }
  logDebug("{} queued, path {}", work->description(), pathName(path, descriptor.op));
  queue_.push_back(std::move(task));
  queuedCount_.fetch_add(1, std::memory_order_release);
  queued_.notify_one();
  return work;
}

void ProcessGroupGloo::Impl::workerLoop() {
  for (;;) {
    Task task;
    // Callers that wait on one collective usually queue the next at once.
    spinUntil([this] { return queuedCount_.load(std::memory_order_acquire) > 0; }, std::chrono::microseconds(50));
    {
      std::unique_lock<std::mutex> lock(mutex_);
      queued_.wait(lock, [&] { return (!queue_.empty() && !running_) || (stopping_ && queue_.empty()); });
      if (queue_.empty()) return;  // stopping, and everything queued has run
      task = std::move(queue_.front());
      queue_.pop_front();
      queuedCount_.fetch_sub(1, std::memory_order_relaxed);
      running_ = true;
    }
    const std::exception_ptr error = runTask(task);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      running_ = false;
    }
    // After running_ is cleared: a waiter that calls again at once may then
    // run its collective in place.
    task.work->finish(error);
  }
}

void ProcessGroupGloo::Impl::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!broken_) broken_ = std::make_exception_ptr(CollectiveError(reason));
  }
  if (shm) shm->markFailed();
  // A TCP collective waiting on a peer fails now, and so do the peers'.
  if (frames) frames->interrupt();
  if (ring) ring->interrupt();
}

void ProcessGroupGloo::Impl::markBroken(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!broken_) broken_ = std::make_exception_ptr(CollectiveError(reason));
  }
  // As after a collective's timeout: this host's peers stop waiting for it.
  if (shm) shm->markFailed();
}

std::exception_ptr ProcessGroupGloo::Impl::failure() {
  std::lock_guard<std::mutex> lock(mutex_);
  return broken_;
}

std::exception_ptr ProcessGroupGloo::Impl::runTask(Task& task) {
  using gloo_backend::Clock;
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    error = broken_;
  }
  if (error) {
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& first) {
      error = std::make_exception_ptr(CollectiveError(
          fmt::format("{} not run: the group failed earlier: {}", task.work->description(), first.what())));
    }
  } else {
    const auto started = Clock::now();
    bool timedOut = false, agreed = false;
    try {
      task.run(task.descriptor, task.deadline);
    } catch (const gloo_backend::AgreedFailure&) {
      error = std::current_exception();
      agreed = true;
    } catch (const CollectiveError&) {
      error = std::current_exception();
      timedOut = Clock::now() >= task.deadline;  // e.g. a block collective's send/recv
    } catch (const std::exception& e) {
      const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started);
      timedOut = Clock::now() >= task.deadline;
      error = std::make_exception_ptr(CollectiveError(fmt::format(
          "{} {} after {} ms (timeout {} ms): {}. HINT: a peer rank may have died, or not called this "
          "collective; {}",
          task.work->description(), timedOut ? "timed out" : "failed", waited.count(), task.timeout.count(),
          e.what(), kRendezvousHelp)));
    }
    if (error) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!broken_) {
          broken_ = error;
        } else {
          // abort() (or a failure on another thread) broke the group while
          // this collective waited: its error says why.
          try {
            std::rethrow_exception(broken_);
          } catch (const std::exception& why) {
            try {
              std::rethrow_exception(error);
            } catch (const std::exception& mine) {
              error = std::make_exception_ptr(
                  CollectiveError(fmt::format("{} aborted: {} ({})", task.work->description(), why.what(), mine.what())));
            }
          }
        }
      }
      if (shm) shm->markFailed();
      // A failure other than a timeout (ranks that disagree, a broken
      // connection) ends the peers' waits on this rank at once, instead of
      // at their timeout. After a timeout every peer waiting times out too,
      // each naming whom it waited for; closing here would blame this rank.
      // A failure every rank agrees on needs no help either.
      if (!timedOut && !agreed) {
        if (frames) frames->reset();
        if (ring) ring->reset();
      }
    }
  }
  return error;
}

}  // namespace ddp
