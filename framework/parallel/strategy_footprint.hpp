// What each built-in strategy holds per rank and sends per step, computed
// from the layout the strategy itself uses (FlatShards) rather than
// estimated: the formulas behind the large-model table in
// docs/performance.md. Tests and `ddp-bench strategies` check them against
// what the strategies report (ParallelStrategy::heldBytes) on real models.
//
// Contract
// - numels: the trainable parameters' element counts in registration
//   order; elementSize: bytes per element (4 for float32);
//   optimizerTensors: the optimizer's per-element state tensors (Adam 2,
//   SGD with momentum 1); bucketCapBytes: DdpOptions::bucketCapBytes.
// - The bytes are those of the rank that holds the most (rank 0), between
//   steps. ddp at one rank is LocalStrategy, which keeps no gradients.
// - sentBytesPerStep: what one rank sends per optimizer step with ring
//   algorithms: (world - 1) / world of the buffer for a reduce-scatter or
//   an allgather, twice that for an allreduce.
// - fsdp: unitOf[i] is parameter i's unit, -1 (or unitOf empty) the root,
//   laid out as FsdpStrategy does (unitMajorOrder). Parameters held: the
//   shard plus the root, whole; sent: each unit gathered for forward and
//   again for backward and reduce-scattered, the root reduce-scattered and
//   gathered after the step.
// - Unknown strategy names throw UsageError.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ddp {

struct StrategyFootprint {
  int64_t parameterBytes = 0, gradientBytes = 0, optimizerBytes = 0;
  int64_t sentBytesPerStep = 0;
};

StrategyFootprint strategyFootprint(const std::string& strategy, const std::vector<int64_t>& numels, int world,
                                    int64_t elementSize, int optimizerTensors, int64_t bucketCapBytes,
                                    const std::vector<int>& unitOf = {});

}  // namespace ddp
