#include "framework/comm/work.hpp"

#include "framework/core/errors.hpp"
#include "framework/core/help_links.hpp"

namespace ddp {

Work::Work(std::string description, std::chrono::milliseconds timeout)
    : description_(std::move(description)), timeout_(timeout) {}

// The backend enforces timeout_ itself and reports which peer it waited for;
// the grace period lets that more precise error arrive first.
void Work::wait() { wait(timeout_ + std::chrono::milliseconds(2000)); }

void Work::wait(std::chrono::milliseconds timeout) {
  spinUntil([this] { return completedFlag_.load(std::memory_order_acquire); }, std::chrono::microseconds(50));
  std::unique_lock<std::mutex> lock(mutex_);
  if (!done_.wait_for(lock, timeout, [&] { return completed_; })) {
    fail<CollectiveError>("{}: not completed after waiting {} ms in Work::wait. HINT: a peer may not have reached "
                          "this collective; {}",
                          description_, timeout.count(), kRendezvousHelp);
  }
  if (error_) std::rethrow_exception(error_);
}

bool Work::isCompleted() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_;
}

bool Work::isSuccess() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_ && !error_;
}

std::exception_ptr Work::exception() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return error_;
}

void Work::finish(std::exception_ptr error) {
  std::vector<std::function<void()>> callbacks;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    DDP_CHECK(!completed_, description_ + " finished twice");
    completed_ = true;
    error_ = error;
    completedFlag_.store(true, std::memory_order_release);
    callbacks.swap(callbacks_);
  }
  done_.notify_all();
  for (auto& cb : callbacks) cb();
}

void Work::onFinish(std::function<void()> callback) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!completed_) {
      callbacks_.push_back(std::move(callback));
      return;
    }
  }
  callback();
}

std::shared_ptr<Work> Work::failedEarlier(std::string description, const std::exception_ptr& first) {
  auto work = std::make_shared<Work>(std::move(description), std::chrono::milliseconds(0));
  std::string why = "unknown failure";
  try {
    std::rethrow_exception(first);
  } catch (const std::exception& e) {
    why = e.what();
  } catch (...) {
  }
  work->finish(std::make_exception_ptr(
      CollectiveError(fmt::format("{} not run: the group failed earlier: {}", work->description(), why))));
  return work;
}

std::shared_ptr<Work> Work::completed(std::string description) {
  auto work = std::make_shared<Work>(std::move(description), std::chrono::milliseconds(0));
  work->finish();
  return work;
}

void failInvariant(const char* condition, const char* file, int line, const std::string& what) {
  fail<std::logic_error>("internal error: {} ({} failed at {}:{})", what, condition, file, line);
}

WorkPtr thenWork(const WorkPtr& first, std::chrono::milliseconds timeout, std::function<void()> then) {
  auto next = std::make_shared<Work>(first->description() + " (then)", timeout);
  first->onFinish([first, next, then = std::move(then)] {
    std::exception_ptr error = first->exception();
    if (!error) {
      try {
        then();
      } catch (...) {
        error = std::current_exception();
      }
    }
    next->finish(error);
  });
  return next;
}

}  // namespace ddp
