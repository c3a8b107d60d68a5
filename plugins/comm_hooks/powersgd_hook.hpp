// PowerSgdHook: low-rank gradient compression with error feedback
// (Vogels, Karimireddy and Jaggi, "PowerSGD", NeurIPS 2019), as a DDP
// communication hook.
//
// Contract
// - Each gradient of two or more dimensions is seen as a matrix M of
//   rows = size(0) and cols = the rest. It is compressed when
//   rows * cols >= minCompressionRate * rank * (rows + cols): the ranks
//   exchange P = M Q (rows x rank), orthogonalize it, then exchange
//   Q = M^T P (cols x rank), and every rank takes P Q^T / world size as
//   the averaged gradient. Two allreduces of (rows + cols) * rank numbers
//   replace one of rows * cols.
// - Error feedback: what compression lost on this rank (its M minus the
//   result) is added to its next gradient, so the sum of the applied
//   updates follows the sum of the true ones.
// - Vectors (biases, norms), matrices too small to gain, and buckets that
//   are not float32 or float64 are averaged exactly, in one allreduce with
//   the Ps.
// - Q is kept from step to step (warm start), so one power iteration per
//   step tracks the gradients' top singular vectors. It starts from the
//   same pseudo-random matrix on every rank.
// - The first startSteps optimizer steps are averaged exactly (the
//   gradients change fastest then), as PyTorch's start_powerSGD_iter.
// - Collectives are issued in the same order on every rank: a bucket's
//   second allreduce (Q) is issued when its first has completed, and the
//   next bucket's first waits behind it. Nothing blocks the caller.
// - The state (Q, error feedback) lives in the hook, not in checkpoints: a
//   resumed run starts it afresh.
#pragma once

#include <cstdint>
#include <memory>

#include "framework/parallel/comm_hook.hpp"

namespace ddp::plugins {

class PowerSgdHook : public CommHook {
 public:
  struct Options {
    int64_t rank = 1;               // columns of P and Q
    int64_t startSteps = 10;        // exact averaging first
    double minCompressionRate = 2;  // compress a matrix only when it shrinks at least this much
    Milliseconds timeout{300000};   // of the collectives, > 0
  };
  explicit PowerSgdHook(Options options);
  ~PowerSgdHook() override;
  WorkPtr run(ProcessGroup& group, GradBucket& bucket) override;

  // Numbers this rank sends per step for `bucket`'s parameters, compressed
  // (Ps, Qs and the exact part) and not; for logs and tests.
  struct Sizes {
    int64_t compressed = 0;
    int64_t uncompressed = 0;
  };
  static Sizes sizesFor(const std::vector<at::Tensor>& parameters, const Options& options);

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;  // shared with the callbacks of collectives in flight
};

}  // namespace ddp::plugins
