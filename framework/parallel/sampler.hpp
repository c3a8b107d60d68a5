// DistributedSampler: which samples each rank reads in each epoch.
//
// Contract
// - Every epoch has one permutation of 0..datasetSize-1 (the identity
//   without shuffle), the same on every rank and every platform: a
//   Fisher-Yates shuffle driven by std::mt19937_64 seeded with seed + epoch,
//   with our own unbiased bounded draw (std::uniform_int_distribution
//   differs between standard libraries).
// - Rank r takes positions r, r + w, r + 2w, ... of that permutation, so the
//   shards of one epoch are disjoint.
// - Without dropLast every rank gets ceil(N / w) samples: the permutation
//   is padded by repeating it from its start. With dropLast every rank gets
//   floor(N / w) and the tail of the permutation is left out. With neither
//   padding nor dropLast (pad false: uneven inputs, training.join), each
//   sample is read once per epoch: ranks below N mod w get one more.
// - nextEpoch() returns this rank's indices for the current epoch and moves
//   to the next one, so the order changes every epoch without a call to
//   setEpoch() (which is for resuming from a checkpoint).
#pragma once

#include <cstdint>
#include <vector>

namespace ddp {

class DistributedSampler {
 public:
  DistributedSampler(int64_t datasetSize, int rank, int worldSize, uint64_t seed = 0, bool shuffle = true,
                     bool dropLast = false, bool pad = true);

  // The samples rank `rank` gets per epoch, as the constructor computes it.
  static int64_t samplesFor(int64_t datasetSize, int rank, int worldSize, bool dropLast, bool pad);

  // This rank's indices for epoch(), then advances the epoch.
  std::vector<int64_t> nextEpoch();
  // This rank's indices for any epoch; changes nothing.
  std::vector<int64_t> indicesForEpoch(int64_t epoch) const;

  // Elastic re-sharding after the world changed mid-epoch: positions
  // consumed + rank, + worldSize, ... of the epoch's permutation, unpadded.
  // The first `consumed` positions are what the ranks read before (shards
  // are dealt position by position, so any number of steps at one world
  // size reads a prefix), so the rest of the epoch is read once, by
  // whichever ranks are left.
  // With equalShards (a strategy that cannot shadow a rank's missing
  // steps), every rank gets as many: ceil(left / worldSize), the positions
  // past the permutation's end repeating it from its start as the padded
  // sampler does, or with dropLast floor(left / worldSize), the tail left
  // out.
  std::vector<int64_t> remainderForEpoch(int64_t epoch, int64_t consumed, int rank, int worldSize,
                                         bool equalShards = false, bool dropLast = false) const;
  static int64_t remainderSamplesFor(int64_t datasetSize, int64_t consumed, int rank, int worldSize,
                                     bool equalShards = false, bool dropLast = false);

  void setEpoch(int64_t epoch);
  int64_t epoch() const { return epoch_; }

  int64_t datasetSize() const { return datasetSize_; }
  int64_t samplesPerRank() const { return samplesPerRank_; }
  int rank() const { return rank_; }
  int worldSize() const { return worldSize_; }

 private:
  std::vector<int64_t> permutation(int64_t epoch) const;
  int64_t datasetSize_;
  int rank_;
  int worldSize_;
  uint64_t seed_;
  bool shuffle_;
  bool dropLast_;
  bool pad_;
  int64_t samplesPerRank_;
  int64_t epoch_ = 0;
};

}  // namespace ddp
