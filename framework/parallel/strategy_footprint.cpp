#include "framework/parallel/strategy_footprint.hpp"

#include <algorithm>

#include "framework/core/errors.hpp"
#include "framework/parallel/flat_shards.hpp"

namespace ddp {

namespace {

// Elements of real parameters (not padding) in rank 0's shard.
int64_t rankZeroElements(const FlatShards& shards) {
  int64_t n = 0;
  for (size_t i = 0; i < shards.paramCount(); ++i)
    if (auto piece = shards.pieceOf(i, 0)) n += piece->length;
  return n;
}

int64_t ringShare(int64_t bytes, int world) { return bytes * (world - 1) / world; }

}  // namespace

StrategyFootprint strategyFootprint(const std::string& strategy, const std::vector<int64_t>& numels, int world,
                                    int64_t elementSize, int optimizerTensors, int64_t bucketCapBytes) {
  DDP_CHECK(world >= 1 && elementSize > 0, "strategyFootprint: world and elementSize must be positive");
  int64_t total = 0;
  for (int64_t n : numels) total += n;
  StrategyFootprint f;
  const int64_t e = elementSize;
  if (strategy == "ddp") {
    f.parameterBytes = total * e;
    f.gradientBytes = world > 1 ? total * e : 0;  // DDP's buckets; one rank keeps none
    f.optimizerBytes = optimizerTensors * total * e;
    f.sentBytesPerStep = 2 * ringShare(total * e, world);
    return f;
  }
  if (strategy == "zero1" || strategy == "zero2" || strategy == "fsdp") {
    std::vector<int64_t> order = numels;
    const bool bucketed = strategy != "zero1";
    if (bucketed) std::reverse(order.begin(), order.end());
    const FlatShards shards(order, world, bucketed ? std::max<int64_t>(1, bucketCapBytes / e) : 0);
    const int64_t padded = shards.paddedTotal() * e, shard = shards.shardSize() * e;
    f.optimizerBytes = optimizerTensors * rankZeroElements(shards) * e;
    if (strategy == "zero1") {
      f.parameterBytes = padded;
      f.gradientBytes = padded + shard;
      f.sentBytesPerStep = 2 * ringShare(padded, world);
    } else if (strategy == "zero2") {
      f.parameterBytes = padded;
      f.gradientBytes = shard;
      f.sentBytesPerStep = 2 * ringShare(padded, world);
    } else {
      int64_t largest = 0;
      for (const auto& b : shards.buckets()) largest = std::max(largest, b.padded(world) * e);
      f.parameterBytes = shard + largest;
      f.gradientBytes = shard;
      f.sentBytesPerStep = 3 * ringShare(padded, world);  // gather for forward, again for backward, reduce-scatter
    }
    return f;
  }
  fail<UsageError>("no footprint formula for strategy \"{}\" (known: ddp, zero1, zero2, fsdp)", strategy);
}

}  // namespace ddp
