// Shared by the tests of the sharded strategies and of sharded checkpoints:
// a small net with two FSDP units and batch norm, its data, its optimizers
// and a training loop in which rank r trains on its slice of each batch.
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "framework/comm/process_group.hpp"
#include "framework/parallel/sharding_units.hpp"
#include "framework/parallel/strategy.hpp"
#include "tests/test_support.hpp"

namespace ddp::test {

// 10 -> 7 -> 3 with batch norm: 70 + 7 + 7 + 7 + 21 + 3 = 115 trainable
// elements, which no world size from 2 to 4 divides. Under fsdp fc1 and fc2
// are units, batch norm's 14 stay with the root.
struct Net : torch::nn::Module, ShardingUnits {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
  Net() {
    fc1 = register_module("fc1", torch::nn::Linear(10, 7));
    bn = register_module("bn", torch::nn::BatchNorm1d(7));
    fc2 = register_module("fc2", torch::nn::Linear(7, 3));
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = runUnit(0, [&] { return fc1->forward(x); });
    h = torch::relu(bn->forward(h));
    return runUnit(1, [&] { return fc2->forward(h); });
  }
  std::vector<std::shared_ptr<torch::nn::Module>> shardingUnits() override { return {fc1.ptr(), fc2.ptr()}; }
};
inline const std::vector<int> kNetUnits = {0, 0, -1, -1, 1, 1};  // per parameter, registration order


inline at::Tensor flatState(torch::nn::Module& module) {
  std::vector<at::Tensor> pieces;
  for (auto& p : module.parameters()) pieces.push_back(p.detach().reshape({-1}).clone());
  for (auto& b : module.buffers()) pieces.push_back(b.detach().reshape({-1}).to(at::kFloat));
  return at::cat(pieces);
}

inline std::unique_ptr<torch::optim::Optimizer> referenceOptimizer(const std::string& kind, std::vector<at::Tensor> params) {
  if (kind == "sgd") return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1).momentum(0.9));
  if (kind == "adam") return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(0.01));
  return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(0.01).weight_decay(0.1));
}

struct ZeroData {
  at::Tensor x, y;
};

inline ZeroData makeZeroData(int64_t n) {
  auto gen = at::detail::createCPUGenerator(7);
  return {at::randn({n, 10}, gen), at::randint(3, {n}, gen, at::kLong)};
}

constexpr int64_t kBatch = 4;

// Steps [from, to) of a run: rank r trains on its slice of each global
// batch, in `micro` micro-batches (the loss of each scaled by 1/micro).
inline void trainSteps(ParallelStrategy& s, const ZeroData& data, int rank, int world, int from, int to, int micro = 1) {
  auto& net = static_cast<Net&>(s.model());
  for (int k = from; k < to; ++k) {
    const int64_t begin = (int64_t(k) * world + rank) * kBatch;
    for (int m = 0; m < micro; ++m) {
      const int64_t b = begin + m * kBatch / micro, e = begin + (m + 1) * kBatch / micro;
      at::Tensor loss =
          torch::nn::functional::cross_entropy(net.forward(data.x.slice(0, b, e)), data.y.slice(0, b, e)) / micro;
      s.backward(loss, m + 1 == micro);
    }
    s.step();
  }
}

// Buckets of 64 bytes: zero2 cuts the 115 elements into several.
constexpr size_t kBucketBytes = 64;

inline std::unique_ptr<ParallelStrategy> makeStrategy(const std::string& name, ProcessGroup& pg, const std::string& opt,
                                               std::shared_ptr<Net> net) {
  StrategyContext c;
  c.model = net;
  c.optimizer = referenceOptimizer(opt, net->parameters());
  c.group = borrow(pg);
  c.ddp.bucketCapBytes = kBucketBytes;
  return builtinStrategies().create(name, std::move(c));
}

inline double relDiff(const at::Tensor& a, const at::Tensor& b) {
  return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item<double>();
}


}  // namespace ddp::test
