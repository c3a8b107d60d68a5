// FlatShards: how sharded strategies (ZeRO) split a model's trainable
// parameters between ranks.
//
// Contract
// - The parameters are laid end to end, in the order given (registration
//   order), in one flat index space of total() elements, padded at the end
//   to paddedTotal() = ranks * shardSize(), shardSize() = ceil(total /
//   ranks) (at least 1). Rank r owns [r * shardSize(), (r + 1) * shardSize()).
//   The last ranks may own only padding when total is small.
// - A parameter's intersection with one rank's range is at most one
//   contiguous piece (pieceOf). Pieces of all ranks tile the parameter in
//   rank order, which is what gathering a piece-wise state relies on.
// - Pure arithmetic: no tensors are held, nothing is communicated.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace ddp {

class FlatShards {
 public:
  struct Piece {
    int64_t paramOffset = 0;  // first element within the parameter (flattened)
    int64_t shardOffset = 0;  // first element within the owning rank's shard
    int64_t length = 0;       // > 0
  };

  FlatShards(const std::vector<int64_t>& numels, int ranks);

  int ranks() const { return ranks_; }
  int64_t total() const { return total_; }
  int64_t shardSize() const { return shardSize_; }
  int64_t paddedTotal() const { return shardSize_ * ranks_; }
  size_t paramCount() const { return offsets_.size(); }
  // Where parameter i starts in the flat index space.
  int64_t offset(size_t i) const { return offsets_[i]; }
  int64_t numel(size_t i) const { return numels_[i]; }
  // The part of parameter i that rank `rank` owns, if any.
  std::optional<Piece> pieceOf(size_t i, int rank) const;

 private:
  int ranks_;
  std::vector<int64_t> numels_, offsets_;
  int64_t total_ = 0, shardSize_ = 1;
};

}  // namespace ddp
