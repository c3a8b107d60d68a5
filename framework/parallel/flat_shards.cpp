#include "framework/parallel/flat_shards.hpp"

#include <algorithm>

#include "framework/core/errors.hpp"

namespace ddp {

FlatShards::FlatShards(const std::vector<int64_t>& numels, int ranks, int64_t bucketCapElements)
    : ranks_(ranks), numels_(numels) {
  DDP_CHECK(ranks >= 1, "FlatShards: ranks must be >= 1");
  for (size_t i = 0; i < numels.size(); ++i) {
    DDP_CHECK(numels[i] >= 0, "FlatShards: negative element count");
    const bool full = !buckets_.empty() && bucketCapElements > 0 &&
                      buckets_.back().length + numels[i] > bucketCapElements && buckets_.back().length > 0;
    if (buckets_.empty() || full) {
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

}  // namespace ddp
