#include "framework/parallel/sampler.hpp"

#include <algorithm>
#include <numeric>
#include <random>
#include <string>

#include "framework/core/errors.hpp"

namespace ddp {

namespace {

// Uniform in [0, bound): rejects the few draws that would bias the modulo.
uint64_t boundedDraw(std::mt19937_64& rng, uint64_t bound) {
  const uint64_t threshold = (0 - bound) % bound;  // 2^64 mod bound
  uint64_t r = rng();
  while (r < threshold) r = rng();
  return r % bound;
}

}  // namespace

int64_t DistributedSampler::samplesFor(int64_t datasetSize, int rank, int worldSize, bool dropLast, bool pad) {
  if (dropLast) return datasetSize / worldSize;
  if (pad) return (datasetSize + worldSize - 1) / worldSize;
  return datasetSize > rank ? (datasetSize - rank + worldSize - 1) / worldSize : 0;
}

DistributedSampler::DistributedSampler(int64_t datasetSize, int rank, int worldSize, uint64_t seed, bool shuffle,
                                       bool dropLast, bool pad)
    : datasetSize_(datasetSize),
      rank_(rank),
      worldSize_(worldSize),
      seed_(seed),
      shuffle_(shuffle),
      dropLast_(dropLast),
      pad_(pad) {
  if (datasetSize < 0) fail<UsageError>("DistributedSampler: dataset size must be >= 0, got {}", datasetSize);
  if (worldSize < 1 || rank < 0 || rank >= worldSize) {
    fail<UsageError>("DistributedSampler: rank {} is outside world size {}", rank, worldSize);
  }
  samplesPerRank_ = samplesFor(datasetSize_, rank_, worldSize_, dropLast_, pad_);
}

std::vector<int64_t> DistributedSampler::permutation(int64_t epoch) const {
  std::vector<int64_t> order(static_cast<size_t>(datasetSize_));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (shuffle_) {
    std::mt19937_64 rng(seed_ + static_cast<uint64_t>(epoch));
    for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[boundedDraw(rng, i)]);
  }
  return order;
}

int64_t DistributedSampler::remainderSamplesFor(int64_t datasetSize, int64_t consumed, int rank, int worldSize,
                                                bool equalShards, bool dropLast) {
  const int64_t left = std::max<int64_t>(0, datasetSize - consumed);
  if (equalShards) return dropLast ? left / worldSize : (left + worldSize - 1) / worldSize;
  return left > rank ? (left - rank + worldSize - 1) / worldSize : 0;
}

std::vector<int64_t> DistributedSampler::remainderForEpoch(int64_t epoch, int64_t consumed, int rank, int worldSize,
                                                           bool equalShards, bool dropLast) const {
  if (worldSize < 1 || rank < 0 || rank >= worldSize || consumed < 0) {
    fail<UsageError>("DistributedSampler: rank {} of world size {} after {} samples", rank, worldSize, consumed);
  }
  const std::vector<int64_t> order = permutation(epoch);
  const int64_t count = remainderSamplesFor(datasetSize_, consumed, rank, worldSize, equalShards, dropLast);
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(count));
  for (int64_t k = 0; k < count; ++k) {
    const int64_t position = consumed + rank + k * worldSize;
    mine.push_back(order[static_cast<size_t>(position % datasetSize_)]);
  }
  return mine;
}

std::vector<int64_t> DistributedSampler::indicesForEpoch(int64_t epoch) const {
  const std::vector<int64_t> order = permutation(epoch);
  // Position k of the padded permutation is order[k mod N]: padding repeats
  // from the start (more than once when N < world size).
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(samplesPerRank_));
  for (int64_t j = 0; j < samplesPerRank_; ++j) {
    const int64_t position = rank_ + j * worldSize_;
    mine.push_back(order[static_cast<size_t>(position % datasetSize_)]);
  }
  return mine;
}

std::vector<int64_t> DistributedSampler::nextEpoch() { return indicesForEpoch(epoch_++); }

void DistributedSampler::setEpoch(int64_t epoch) {
  if (epoch < 0) fail<UsageError>("DistributedSampler: epoch must be >= 0, got {}", epoch);
  epoch_ = epoch;
}

}  // namespace ddp
