#include "framework/parallel/shard_grad_reducer.hpp"

#include <ATen/ATen.h>

#include "framework/core/errors.hpp"

namespace ddp {

ShardGradReducer::ShardGradReducer(std::vector<at::Tensor> params, const FlatShards& shards, ProcessGroup& group,
                                   Milliseconds timeout, at::Tensor shardGrad, const char* who,
                                   size_t maxInFlight)
    : params_(std::move(params)),
      shards_(shards),
      group_(group),
      timeout_(timeout),
      shardGrad_(std::move(shardGrad)),
      who_(who),
      staging_(shards.buckets().size()),
      scratch_(shards.buckets().size()),
      arrived_(shards.buckets().size(), 0),
      fresh_(shards.buckets().size(), true),
      maxInFlight_(maxInFlight) {}

void ShardGradReducer::shardZeroed() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::fill(fresh_.begin(), fresh_.end(), true);
}

void ShardGradReducer::add(size_t i) {
  std::lock_guard<std::mutex> lock(mutex_);
  at::Tensor& grad = params_[i].mutable_grad();
  if (!grad.defined()) return;
  if (grad.is_sparse()) {
    fail<UsageError>("{}: parameter #{} got a sparse gradient; it reduces dense gradients. HINT: use dense "
                     "embeddings (sparse=false) or distributed.strategy=ddp",
                     who_, i);
  }
  const size_t b = shards_.bucketOf(i);
  const FlatShards::Bucket& bucket = shards_.buckets()[b];
  const bool alone = bucket.endParam - bucket.firstParam == 1 && bucket.padded(group_.size()) == grad.numel();
  if (alone && grad.is_contiguous() && grad.scalar_type() == shardGrad_.scalar_type()) {
    // A bucket of this one gradient, needing no padding: it is sent as it
    // is (autograd handed it over; nothing else refers to it), no copy.
    staging_[b] = grad.view({-1});
  } else {
    if (!staging_[b].defined()) staging_[b] = at::zeros({bucket.padded(group_.size())}, shardGrad_.options());
    staging_[b].narrow(0, shards_.offset(i) - bucket.offset, params_[i].numel()).copy_(grad.reshape({-1}));
  }
  grad.reset();  // the bucket holds it now
  ++arrived_[b];
  // Buckets start in index order on every rank, whatever order the hooks
  // fire in, so every rank issues the same collectives.
  const auto& buckets = shards_.buckets();
  while (nextLaunch_ < arrived_.size() &&
         arrived_[nextLaunch_] == buckets[nextLaunch_].endParam - buckets[nextLaunch_].firstParam) {
    launchLocked(nextLaunch_++);
  }
}

void ShardGradReducer::launchLocked(size_t b) {
  const FlatShards::Bucket& bucket = shards_.buckets()[b];
  if (!staging_[b].defined()) staging_[b] = at::zeros({bucket.padded(group_.size())}, shardGrad_.options());
  // The first reduction into a zeroed shard writes it directly; later ones
  // (micro-batches) are added from a scratch buffer.
  at::Tensor out = shardGrad_.narrow(0, bucket.shardOffset, bucket.slice);
  if (!fresh_[b]) out = scratch_[b] = at::empty({bucket.slice}, shardGrad_.options());
  fresh_[b] = false;
  inFlight_.emplace_back(b, group_.reduceScatter(staging_[b], out, {ReduceOp::Avg, timeout_}));
  while (inFlight_.size() > maxInFlight_) finishOldestLocked();
}

void ShardGradReducer::finishOldestLocked() {
  auto [b, work] = std::move(inFlight_.front());
  inFlight_.pop_front();
  work->wait();
  const FlatShards::Bucket& bucket = shards_.buckets()[b];
  if (scratch_[b].defined()) shardGrad_.narrow(0, bucket.shardOffset, bucket.slice).add_(scratch_[b]);
  staging_[b].reset();
  scratch_[b].reset();
}

void ShardGradReducer::flush() {
  std::lock_guard<std::mutex> lock(mutex_);
  struct Reset {  // also when a collective fails: the next backward starts clean
    ShardGradReducer& r;
    ~Reset() {
      std::fill(r.arrived_.begin(), r.arrived_.end(), 0);
      r.nextLaunch_ = 0;
      r.inFlight_.clear();
      for (auto& t : r.staging_) t.reset();
      for (auto& t : r.scratch_) t.reset();
    }
  } reset{*this};
  while (nextLaunch_ < arrived_.size()) launchLocked(nextLaunch_++);
  while (!inFlight_.empty()) finishOldestLocked();
}

std::vector<at::Tensor> ShardGradReducer::staging() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return staging_;
}

}  // namespace ddp
