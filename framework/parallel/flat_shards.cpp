#include "framework/parallel/flat_shards.hpp"

#include <algorithm>

#include "framework/core/errors.hpp"

namespace ddp {

FlatShards::FlatShards(const std::vector<int64_t>& numels, int ranks, int64_t bucketCapElements,
                       const std::vector<int>& groups)
    : ranks_(ranks), numels_(numels) {
  DDP_CHECK(ranks >= 1, "FlatShards: ranks must be >= 1");
  DDP_CHECK(groups.empty() || groups.size() == numels.size(), "FlatShards: one group per parameter");
  for (size_t i = 0; i < numels.size(); ++i) {
    DDP_CHECK(numels[i] >= 0, "FlatShards: negative element count");
    const bool full = !buckets_.empty() && bucketCapElements > 0 &&
                      buckets_.back().length + numels[i] > bucketCapElements && buckets_.back().length > 0;
    const bool newGroup = !groups.empty() && i > 0 && groups[i] != groups[i - 1];
    if (buckets_.empty() || full || newGroup) {
      Bucket b;
      b.firstParam = i;
      b.offset = paddedTotal_;
      buckets_.push_back(b);
    }
    Bucket& b = buckets_.back();
    offsets_.push_back(b.offset + b.length);
    bucketOf_.push_back(buckets_.size() - 1);
    b.length += numels[i];
    b.endParam = i + 1;
    // Keep the running totals as if this bucket were complete.
    b.slice = std::max<int64_t>(1, (b.length + ranks - 1) / ranks);
    total_ += numels[i];
    paddedTotal_ = b.offset + b.padded(ranks);
  }
  for (Bucket& b : buckets_) {
    b.shardOffset = shardSize_;
    shardSize_ += b.slice;
  }
}

std::optional<FlatShards::Piece> FlatShards::pieceOf(size_t i, int rank) const {
  const Bucket& b = buckets_[bucketOf_[i]];
  const int64_t start = offsets_[i] - b.offset;  // within the bucket
  const int64_t begin = std::max(start, rank * b.slice);
  const int64_t end = std::min(start + numels_[i], (rank + 1) * b.slice);
  if (end <= begin) return std::nullopt;
  return Piece{begin - start, b.shardOffset + begin - rank * b.slice, end - begin};
}

std::vector<size_t> unitMajorOrder(const std::vector<int>& unitOf) {
  std::vector<size_t> order;
  for (size_t i = unitOf.size(); i-- > 0;) order.push_back(i);
  // Units by descending number, the root (-1) after all of them.
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const bool ra = unitOf[a] < 0, rb = unitOf[b] < 0;
    if (ra != rb) return rb;  // the root last
    return !ra && unitOf[a] > unitOf[b];
  });
  return order;
}

}  // namespace ddp
