// TraceWriter: a timeline of a few optimizer steps, as one Chrome-trace
// file (trace.json in the run folder) that Perfetto (ui.perfetto.dev) and
// chrome://tracing open.
//
// - On with training.trace (or the environment variable DDP_TRACE=1); it
//   records optimizer steps training.trace_start .. trace_start +
//   trace_steps - 1 (framework/core/trace.hpp holds the recorder).
// - Each rank is a process in the viewer, with two tracks: "compute" (data,
//   forward, backward, optimizer step, the wait for gradients inside it)
//   and "communication" (each gradient bucket's collective, from the
//   moment the backend could start it to its completion; the collectives
//   of one group run one after another, so the track shows that stream).
//   Each span's args carry its step, and a bucket's its index, bytes and
//   when it was launched.
// - Ranks of one host (one boot) share a clock, so their spans line up
//   exactly. Ranks of other hosts are aligned at a barrier when the trace
//   is written (the first epoch end after the last traced step, or the end
//   of the run): off by the barrier's wake-up time, tens of microseconds.
// - Collective: every rank adds it, and the gather runs at an epoch end
//   or the run's end that every rank reaches with the same step count.
//   wanted() is collective too: DDP_TRACE set on one node traces them all.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "framework/experiment/callbacks/callback.hpp"

namespace ddp {

class TraceWriter : public TrainerCallback {
 public:
  // Whether the run asks for a trace (the config, or DDP_TRACE on any
  // rank: one allreduce, so that every rank adds the callback or none).
  static bool wanted(Trainer& trainer);

  bool wantsSteps() const override { return true; }
  void onTrainBegin(Trainer& trainer) override;
  void onEpochBegin(Trainer& trainer, int64_t epoch) override;
  void onStepEnd(Trainer& trainer, const StepEnd& step) override;
  void onEpochEnd(Trainer& trainer, EpochEnd& end) override;
  void onTrainEnd(Trainer& trainer) override;

 private:
  void maybeStart(Trainer& trainer);
  void write(Trainer& trainer);
  // Rank 0: the ranks' spans into trace.json.
  void writeMerged(Trainer& trainer, const std::vector<std::string>& all);
  int64_t first_ = 0, last_ = 0;  // optimizer steps, 1-based, inclusive
  bool started_ = false, written_ = false;
};

}  // namespace ddp
