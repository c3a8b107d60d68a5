// Trace: spans of what a rank does (data loading, forward, backward, each
// gradient bucket's collective, the optimizer step), recorded for a few
// steps and drawn as a timeline. TraceWriter
// (experiment/callbacks/trace_writer.hpp) turns recording on for the steps
// that training.trace asks for and merges every rank's spans into one
// Chrome-trace file that Perfetto and chrome://tracing open.
//
// Contract
// - Off by default. While off, a Scope or record() costs one relaxed atomic
//   load and records nothing, so the hooks stay in the hot path.
// - record() is thread-safe: gradient hooks run on autograd's threads and a
//   collective finishes on the backend's thread.
// - A span's name is a string literal (the span keeps the pointer); args is
//   a JSON object's text ("" for none), shown beside the span.
// - Times are steady_clock points. Each span carries the optimizer step it
//   belongs to: the step set by setStep() when the span began.
// - start() clears what an earlier window recorded; stop() ends recording
//   and keeps the spans until takeSpans().
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace ddp::trace {

using Clock = std::chrono::steady_clock;

// Where a span is drawn: the rank's compute thread, or its communication
// stream (one backend worker executing collectives in order).
enum class Track : uint8_t { Compute = 0, Comm = 1 };

struct Span {
  const char* name = "";
  Track track = Track::Compute;
  Clock::time_point begin, end;
  int64_t step = 0;
  std::string args;  // a JSON object's text, or ""
};

bool enabled() noexcept;
void start(int64_t step);
void stop();
void setStep(int64_t step) noexcept;
int64_t currentStep() noexcept;
void record(const char* name, Track track, Clock::time_point begin, Clock::time_point end, int64_t step,
            std::string args = {});
std::vector<Span> takeSpans();

// Records [construction, destruction) as one span when tracing is on at
// construction.
class Scope {
 public:
  explicit Scope(const char* name, Track track = Track::Compute) noexcept
      : name_(name), track_(track), on_(enabled()) {
    if (on_) {
      step_ = currentStep();
      begin_ = Clock::now();
    }
  }
  ~Scope() {
    if (on_) record(name_, track_, begin_, Clock::now(), step_);
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  const char* name_;
  Track track_;
  bool on_;
  int64_t step_ = 0;
  Clock::time_point begin_;
};

}  // namespace ddp::trace
