// FlatShards: how sharded strategies (ZeRO) split a model's trainable
// parameters between ranks.
//
// Contract
// - The parameters are laid end to end, in the order given, in one flat
//   index space, cut into buckets of consecutive parameters of at most
//   bucketCapElements elements each (a parameter larger than that is a
//   bucket of its own; a cap <= 0 makes one bucket of everything). With
//   `groups` (one id per parameter), a bucket also ends where the group
//   changes, so no bucket spans two groups (FSDP's units). Each
//   bucket is padded at its end to ranks * slice, slice = ceil(length /
//   ranks) (at least 1), and rank r owns slice r of every bucket: it
//   reduces, steps and gathers that slice. So a bucket is one
//   reduce-scatter and one allgather.
// - A rank's shard is its slices of all buckets, in bucket order:
//   shardSize() elements, the same on every rank.
// - A parameter's intersection with one rank's slice is at most one
//   contiguous piece (pieceOf). The pieces of all ranks tile the parameter
//   in rank order, which is what gathering a piece-wise state relies on.
// - Pure arithmetic: no tensors are held, nothing is communicated.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace ddp {

class FlatShards {
 public:
  struct Bucket {
    size_t firstParam = 0, endParam = 0;  // parameters [firstParam, endParam)
    int64_t offset = 0;       // flat index of its first element
    int64_t length = 0;       // its parameters' elements
    int64_t slice = 1;        // per rank
    int64_t shardOffset = 0;  // where its slice starts in every rank's shard
    int64_t padded(int ranks) const { return slice * ranks; }
  };
  struct Piece {
    int64_t paramOffset = 0;  // first element within the parameter (flattened)
    int64_t shardOffset = 0;  // first element within the owning rank's shard
    int64_t length = 0;       // > 0
  };

  FlatShards(const std::vector<int64_t>& numels, int ranks, int64_t bucketCapElements = 0,
             const std::vector<int>& groups = {});

  int ranks() const { return ranks_; }
  int64_t total() const { return total_; }  // elements of all parameters, without padding
  int64_t shardSize() const { return shardSize_; }
  int64_t paddedTotal() const { return paddedTotal_; }
  size_t paramCount() const { return numels_.size(); }
  const std::vector<Bucket>& buckets() const { return buckets_; }
  size_t bucketOf(size_t i) const { return bucketOf_[i]; }
  // Where parameter i starts in the flat (padded) index space.
  int64_t offset(size_t i) const { return offsets_[i]; }
  int64_t numel(size_t i) const { return numels_[i]; }
  // The part of parameter i that rank `rank` owns, if any.
  std::optional<Piece> pieceOf(size_t i, int rank) const;

 private:
  int ranks_;
  std::vector<int64_t> numels_, offsets_;
  std::vector<size_t> bucketOf_;
  std::vector<Bucket> buckets_;
  int64_t total_ = 0, shardSize_ = 0, paddedTotal_ = 0;
};

// The order fsdp lays its parameters out in (fsdp_strategy.hpp): unitOf[i]
// is parameter i's unit (parameters in registration order), or -1 for the
// root. Returns registration indices in flat order: the last unit's
// parameters first, the root's last, each group's from its last registered
// parameter to its first (the order backward produces gradients).
std::vector<size_t> unitMajorOrder(const std::vector<int>& unitOf);

}  // namespace ddp
