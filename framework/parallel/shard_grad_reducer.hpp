// ShardGradReducer: reduce-scatters gradients bucket by bucket while
// backward runs, keeping only this rank's shard of their average (zero2,
// fsdp).
//
// Contract
// - Buckets and shards are those of `shards` (flat_shards.hpp) over
//   `params`; shardGrad is this rank's gradient shard (shardSize()
//   elements), which the average of each backward is added to.
// - add(i), once backward has put parameter i's gradient in
//   params[i].grad() (GradReadyHooks): the gradient is copied into its
//   bucket's staging buffer (a bucket of one gradient without padding sends
//   the gradient itself) and param.grad() is reset. A bucket whose
//   parameters have all arrived is reduce-scattered (Avg) at once, in
//   bucket order on every rank whatever order gradients arrive in; at most
//   maxInFlight buckets are in flight (their staging held) at a time: more
//   overlaps more communication with backward, fewer holds less memory; 0
//   waits for each bucket as soon as it is sent.
// - The first reduction of a bucket after shardZeroed() (and after
//   construction: shardGrad must start zeroed) is written straight into the
//   shard; later ones (micro-batches) are added to it from a scratch buffer.
//   Thread-safe (autograd's threads).
// - flush(), after backward: buckets not yet sent go now (gradients that
//   did not arrive count as zeros), every reduce-scatter is waited for and
//   added to shardGrad. Also after a failed backward (peers wait for the
//   buckets); the counts start again from zero either way.
// - A sparse gradient is a UsageError naming the parameter's index.
#pragma once

#include <ATen/core/Tensor.h>

#include <deque>
#include <mutex>
#include <vector>

#include "framework/comm/process_group.hpp"
#include "framework/parallel/flat_shards.hpp"

namespace ddp {

class ShardGradReducer {
 public:
  ShardGradReducer(std::vector<at::Tensor> params, const FlatShards& shards, ProcessGroup& group,
                   Milliseconds timeout, at::Tensor shardGrad, const char* who, size_t maxInFlight = 2);
  void add(size_t i);
  void flush();
  // The owner zeroed shardGrad (after its optimizer step).
  void shardZeroed();
  // The staging buffers held now (for the memory count).
  std::vector<at::Tensor> staging() const;

 private:
  void launchLocked(size_t b);
  void finishOldestLocked();

  std::vector<at::Tensor> params_;
  const FlatShards& shards_;
  ProcessGroup& group_;
  Milliseconds timeout_;
  at::Tensor shardGrad_;
  const char* who_;
  mutable std::mutex mutex_;
  std::vector<at::Tensor> staging_, scratch_;
  std::vector<size_t> arrived_;  // per bucket, this backward pass
  std::vector<bool> fresh_;      // per bucket: its shard is zero
  size_t nextLaunch_ = 0;
  std::deque<std::pair<size_t, WorkPtr>> inFlight_;
  size_t maxInFlight_;
};

}  // namespace ddp
