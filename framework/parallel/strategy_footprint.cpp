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
                                    int64_t elementSize, int optimizerTensors, int64_t bucketCapBytes,
                                    const std::vector<int>& unitOf) {
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
  if (strategy == "zero1" || strategy == "zero2") {
    std::vector<int64_t> order = numels;
    const bool bucketed = strategy == "zero2";
    if (bucketed) std::reverse(order.begin(), order.end());
    const FlatShards shards(order, world, bucketed ? std::max<int64_t>(1, bucketCapBytes / e) : 0);
    const int64_t padded = shards.paddedTotal() * e, shard = shards.shardSize() * e;
    f.optimizerBytes = optimizerTensors * rankZeroElements(shards) * e;
    f.parameterBytes = padded;
    f.gradientBytes = strategy == "zero1" ? padded + shard : shard;
    f.sentBytesPerStep = 2 * ringShare(padded, world);
    return f;
  }
  if (strategy == "fsdp") {
    std::vector<int> units = unitOf;
    units.resize(numels.size(), -1);
    std::vector<int64_t> order;
    std::vector<int> groups;
    for (size_t i : unitMajorOrder(units)) {
      order.push_back(numels[i]);
      groups.push_back(units[i]);
    }
    const FlatShards shards(order, world, std::max<int64_t>(1, bucketCapBytes / e), groups);
    f.optimizerBytes = optimizerTensors * rankZeroElements(shards) * e;
    f.gradientBytes = shards.shardSize() * e;
    f.parameterBytes = shards.shardSize() * e;
    for (const auto& b : shards.buckets()) {
      const bool root = groups[b.firstParam] < 0;
      if (root) f.parameterBytes += b.padded(world) * e;
      f.sentBytesPerStep += (root ? 2 : 3) * ringShare(b.padded(world) * e, world);
    }
    return f;
  }
  fail<UsageError>("no footprint formula for strategy \"{}\" (known: ddp, zero1, zero2, fsdp)", strategy);
}

}  // namespace ddp
