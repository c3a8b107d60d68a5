// Work: the handle of one asynchronous collective.
//
// Contract
// - A collective call returns at once with a Work; the operation runs in
//   the background, in the order the calls were made on that group.
// - wait(timeout) blocks until the operation finishes and rethrows its
//   failure as CollectiveError. With no argument it waits up to the
//   collective's own timeout (which the backend enforces as well). If the
//   given timeout passes first it throws CollectiveError, and the operation
//   goes on (and fails by its own timeout if a peer never comes).
// - isCompleted() never blocks: true once finished, successfully or not.
// - exception() is null until the operation has failed.
// - Output tensors may be read only after a successful wait().
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <string>

namespace ddp {

class Work {
 public:
  // `description` names the collective for errors, e.g. "[rank 1/4] gloo allreduce #7 (1000 x float32)".
  Work(std::string description, std::chrono::milliseconds timeout);
  virtual ~Work() = default;

  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  void wait();
  void wait(std::chrono::milliseconds timeout);
  bool isCompleted() const;
  bool isSuccess() const;
  std::exception_ptr exception() const;
  const std::string& description() const { return description_; }
  // A finished recv from any source: the rank its message came from; -1
  // for every other operation.
  virtual int sourceRank() const { return -1; }

  // Called once by the backend when the operation has finished.
  void finish(std::exception_ptr error = nullptr);

  // Runs after finish(), on the thread that finishes; for hooks and timing.
  void onFinish(std::function<void()> callback);

  // A Work that is already complete (world size 1, zero elements).
  static std::shared_ptr<Work> completed(std::string description);
  // A Work already failed because its group broke before it: CollectiveError
  // "<description> not run: the group failed earlier: <first's message>".
  static std::shared_ptr<Work> failedEarlier(std::string description, const std::exception_ptr& first);

 private:
  const std::string description_;
  const std::chrono::milliseconds timeout_;
  mutable std::mutex mutex_;
  std::condition_variable done_;
  bool completed_ = false;
  std::atomic<bool> completedFlag_{false};  // completed_, readable without the lock
  std::exception_ptr error_;
  std::vector<std::function<void()>> callbacks_;
};

using WorkPtr = std::shared_ptr<Work>;

// A Work that completes once `first` has completed and `then` has run on
// the thread that completed it (not run when `first` failed; its error is
// passed on, as is one that `then` throws). Its wait() gives up after
// `timeout` (plus Work's grace), like the collective's own.
WorkPtr thenWork(const WorkPtr& first, std::chrono::milliseconds timeout, std::function<void()> then);

// Polls `ready` for up to `limit` before the caller blocks. Waking a blocked
// thread costs tens of microseconds (more in a VM), longer than a small
// collective takes, so waits that usually end soon spin first.
template <typename Ready>
bool spinUntil(Ready&& ready, std::chrono::microseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (ready()) return true;
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
    if (std::chrono::steady_clock::now() >= until) return ready();
  }
}

}  // namespace ddp
