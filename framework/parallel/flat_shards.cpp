#include "framework/parallel/flat_shards.hpp"

#include <algorithm>

#include "framework/core/errors.hpp"

namespace ddp {

FlatShards::FlatShards(const std::vector<int64_t>& numels, int ranks) : ranks_(ranks), numels_(numels) {
  DDP_CHECK(ranks >= 1, "FlatShards: ranks must be >= 1");
  offsets_.reserve(numels.size());
  for (int64_t n : numels) {
    DDP_CHECK(n >= 0, "FlatShards: negative element count");
    offsets_.push_back(total_);
    total_ += n;
  }
  shardSize_ = std::max<int64_t>(1, (total_ + ranks - 1) / ranks);
}

std::optional<FlatShards::Piece> FlatShards::pieceOf(size_t i, int rank) const {
  const int64_t begin = std::max(offsets_[i], rank * shardSize_);
  const int64_t end = std::min(offsets_[i] + numels_[i], (rank + 1) * shardSize_);
  if (end <= begin) return std::nullopt;
  return Piece{begin - offsets_[i], begin - rank * shardSize_, end - begin};
}

}  // namespace ddp
