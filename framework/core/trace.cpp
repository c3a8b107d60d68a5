#include "framework/core/trace.hpp"

#include <atomic>
#include <mutex>

namespace ddp::trace {
namespace {

std::atomic<bool> gEnabled{false};
std::atomic<int64_t> gStep{0};
std::mutex gMutex;
std::vector<Span>& spans() {
  static std::vector<Span> s;
  return s;
}

}  // namespace

bool enabled() noexcept { return gEnabled.load(std::memory_order_relaxed); }

void start(int64_t step) {
  std::lock_guard<std::mutex> lock(gMutex);
  spans().clear();
  spans().reserve(4096);
  gStep.store(step, std::memory_order_relaxed);
  gEnabled.store(true, std::memory_order_release);
}

void stop() { gEnabled.store(false, std::memory_order_release); }

void setStep(int64_t step) noexcept { gStep.store(step, std::memory_order_relaxed); }

int64_t currentStep() noexcept { return gStep.load(std::memory_order_relaxed); }

void record(const char* name, Track track, Clock::time_point begin, Clock::time_point end, int64_t step,
            std::string args) {
  std::lock_guard<std::mutex> lock(gMutex);
  spans().push_back(Span{name, track, begin, end, step, std::move(args)});
}

std::vector<Span> takeSpans() {
  std::lock_guard<std::mutex> lock(gMutex);
  std::vector<Span> out;
  out.swap(spans());
  return out;
}

}  // namespace ddp::trace
