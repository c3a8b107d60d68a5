// Sharded strategies (zero1) against DDP: the same parameters after the
// same steps, state about 1/world of DDP's, and consolidated checkpoints
// that resume under another strategy and world size. Ranks are threads
// over the gloo backend.
#include <ATen/CPUGeneratorImpl.h>
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <sstream>

#include "framework/core/errors.hpp"
#include "framework/parallel/flat_shards.hpp"
#include "framework/parallel/optimizer_state.hpp"
#include "framework/parallel/strategy.hpp"
#include "framework/parallel/zero_strategy.hpp"
#include "tests/test_support.hpp"

using namespace ddp;
using ddp::test::joinErrors;
using ddp::test::runRanks;

namespace {

ProcessGroupPtr borrow(ProcessGroup& group) {
  return ProcessGroupPtr(&group, [](ProcessGroup*) {});
}

// 10 -> 7 -> 3 with batch norm: 70 + 7 + 7 + 7 + 21 + 3 = 115 trainable
// elements, which no world size from 2 to 4 divides.
struct Net : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
  Net() {
    fc1 = register_module("fc1", torch::nn::Linear(10, 7));
    bn = register_module("bn", torch::nn::BatchNorm1d(7));
    fc2 = register_module("fc2", torch::nn::Linear(7, 3));
  }
  at::Tensor forward(const at::Tensor& x) { return fc2->forward(torch::relu(bn->forward(fc1->forward(x)))); }
};

void initParameters(torch::nn::Module& module, uint64_t seed) {
  at::NoGradGuard noGrad;
  auto gen = at::detail::createCPUGenerator(seed);
  for (auto& p : module.parameters()) p.copy_(at::randn(p.sizes(), gen, p.options()) * 0.3);
}

at::Tensor flatParameters(torch::nn::Module& module) {
  std::vector<at::Tensor> pieces;
  for (auto& p : module.parameters()) pieces.push_back(p.detach().reshape({-1}).clone());
  for (auto& b : module.buffers()) pieces.push_back(b.detach().reshape({-1}).to(at::kFloat));
  return at::cat(pieces);
}

std::unique_ptr<torch::optim::Optimizer> makeOptimizer(const std::string& kind, std::vector<at::Tensor> params) {
  if (kind == "sgd") return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1).momentum(0.9));
  if (kind == "adam") return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(0.01));
  return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(0.01).weight_decay(0.1));
}

struct Data {
  at::Tensor x, y;
};

Data makeData(int64_t n) {
  auto gen = at::detail::createCPUGenerator(7);
  return {at::randn({n, 10}, gen), at::randint(3, {n}, gen, at::kLong)};
}

constexpr int64_t kBatch = 4;

// Steps [from, to) of a run: rank r trains on its slice of each global batch.
void train(ParallelStrategy& s, const Data& data, int rank, int world, int from, int to) {
  auto& net = static_cast<Net&>(s.model());
  for (int k = from; k < to; ++k) {
    const int64_t begin = (int64_t(k) * world + rank) * kBatch;
    at::Tensor loss = torch::nn::functional::cross_entropy(net.forward(data.x.slice(0, begin, begin + kBatch)),
                                                           data.y.slice(0, begin, begin + kBatch));
    s.backward(loss, true);
    s.step();
  }
}

std::unique_ptr<ParallelStrategy> makeStrategy(const std::string& name, ProcessGroup& pg, const std::string& opt,
                                               std::shared_ptr<Net> net) {
  StrategyContext c;
  c.model = net;
  c.optimizer = makeOptimizer(opt, net->parameters());
  c.group = borrow(pg);
  return builtinStrategies().create(name, std::move(c));
}

// Parameters (and buffers) of every rank after `steps` steps of `strategy`.
std::vector<at::Tensor> run(const std::string& strategy, const std::string& opt, int world, int steps,
                            std::vector<int64_t>* stateBytes = nullptr) {
  const Data data = makeData(64 * kBatch);
  std::vector<at::Tensor> out(world);
  if (stateBytes) stateBytes->assign(world, 0);
  auto errors = runRanks("gloo", world, [&](int rank, ProcessGroup& pg) {
    auto net = std::make_shared<Net>();
    initParameters(*net, rank == 0 ? 42 : 1000 + rank);  // the strategy must start everyone from rank 0's
    auto s = makeStrategy(strategy, pg, opt, net);
    train(*s, data, rank, world, 0, steps);
    out[rank] = flatParameters(*net);
    if (stateBytes) (*stateBytes)[rank] = optimizerStateBytes(s->optimizer());
  });
  INFO(joinErrors(errors));
  REQUIRE(joinErrors(errors).empty());
  return out;
}

double relDiff(const at::Tensor& a, const at::Tensor& b) {
  return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item<double>();
}

}  // namespace

TEST_CASE("FlatShards: equal shards, pieces tile every parameter in rank order", "[zero]") {
  const std::vector<int64_t> numels = {0, 1, 5, 7, 0, 3};  // 16 elements
  for (int world = 1; world <= 5; ++world) {
    INFO("world " << world);
    FlatShards s(numels, world);
    CHECK(s.total() == 16);
    CHECK(s.shardSize() == (16 + world - 1) / world);
    CHECK(s.paddedTotal() >= 16);
    CHECK(s.paddedTotal() - 16 < world);
    for (size_t i = 0; i < numels.size(); ++i) {
      int64_t next = 0;  // pieces must continue where the last one ended
      for (int r = 0; r < world; ++r) {
        auto piece = s.pieceOf(i, r);
        if (!piece) continue;
        CHECK(piece->paramOffset == next);
        CHECK(piece->length > 0);
        CHECK(s.offset(i) + piece->paramOffset == r * s.shardSize() + piece->shardOffset);
        CHECK(piece->shardOffset + piece->length <= s.shardSize());
        next += piece->length;
      }
      CHECK(next == numels[i]);
    }
  }
  FlatShards empty({}, 3);
  CHECK(empty.total() == 0);
  CHECK(empty.shardSize() == 1);
  CHECK_FALSE(FlatShards({2}, 3).pieceOf(0, 2).has_value());  // the last rank owns only padding
}

TEST_CASE("zero1 ends every step with DDP's parameters, holding 1/world of its optimizer state", "[zero]") {
  const std::string opt = GENERATE("sgd", "adam", "adamw");
  const int world = GENERATE(1, 2, 3, 4);
  INFO(opt << ", world " << world);
  constexpr int kSteps = 4;
  std::vector<int64_t> zeroBytes, ddpBytes;
  const auto zero = run("zero1", opt, world, kSteps, &zeroBytes);
  const auto reference = run("ddp", opt, world, kSteps, &ddpBytes);
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r);
    CHECK(at::equal(zero[r], zero[0]));
    CHECK(relDiff(zero[r], reference[0]) <= 1e-5);
  }
  // Per element: sgd 1 tensor (momentum), adam/adamw 2 (moments), float32.
  const int64_t perElement = (opt == "sgd" ? 1 : 2) * 4;
  const int64_t shard = (115 + world - 1) / world;
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r << ": zero1 " << zeroBytes[r] << " B, ddp " << ddpBytes[r] << " B");
    CHECK(zeroBytes[r] <= shard * perElement + 64);  // + step counters
    CHECK(ddpBytes[r] >= 115 * perElement);
  }
}

TEST_CASE("a zero1 checkpoint is consolidated: it resumes under ddp and zero1 at another world size", "[zero]") {
  const std::string opt = GENERATE("sgd", "adam");
  INFO(opt);
  const Data data = makeData(64 * kBatch);
  // 3 steps under zero1 at world 3; rank 0 writes the checkpoint.
  std::string checkpoint;
  auto errors = runRanks("gloo", 3, [&](int rank, ProcessGroup& pg) {
    auto net = std::make_shared<Net>();
    initParameters(*net, 42);
    auto s = makeStrategy("zero1", pg, opt, net);
    train(*s, data, rank, 3, 0, 3);
    torch::serialize::OutputArchive archive;
    s->saveState(rank == 0 ? &archive : nullptr);
    if (rank == 0) {
      std::ostringstream bytes;
      archive.save_to(bytes);
      checkpoint = bytes.str();
    }
  });
  REQUIRE(joinErrors(errors).empty());
  // The same 3 steps under ddp, saved the same way.
  std::string reference;
  errors = runRanks("gloo", 3, [&](int rank, ProcessGroup& pg) {
    auto net = std::make_shared<Net>();
    initParameters(*net, 42);
    auto s = makeStrategy("ddp", pg, opt, net);
    train(*s, data, rank, 3, 0, 3);
    torch::serialize::OutputArchive archive;
    s->saveState(rank == 0 ? &archive : nullptr);
    if (rank == 0) {
      std::ostringstream bytes;
      archive.save_to(bytes);
      reference = bytes.str();
    }
  });
  REQUIRE(joinErrors(errors).empty());

  // Both resumed for 2 more steps at world 2, under each strategy: all four
  // end alike (a checkpoint that lost or misplaced state would not).
  auto resume = [&](const std::string& saved, const std::string& strategy) {
    std::vector<at::Tensor> out(2);
    auto errs = runRanks("gloo", 2, [&](int rank, ProcessGroup& pg) {
      auto net = std::make_shared<Net>();
      auto optimizer = makeOptimizer(opt, net->parameters());
      std::istringstream bytes(saved);
      torch::serialize::InputArchive archive;
      archive.load_from(bytes);
      loadModelAndOptimizer(archive, *net, *optimizer);
      StrategyContext c;
      c.model = net;
      c.optimizer = std::move(optimizer);
      c.group = borrow(pg);
      auto s = builtinStrategies().create(strategy, std::move(c));
      train(*s, data, rank, 2, 3, 5);
      out[rank] = flatParameters(*net);
    });
    INFO(joinErrors(errs));
    REQUIRE(joinErrors(errs).empty());
    return out;
  };
  const auto base = resume(reference, "ddp");
  struct Case {
    const char* label;
    const std::string& saved;
    const char* strategy;
  };
  for (const Case& c : {Case{"zero1 checkpoint", checkpoint, "ddp"}, Case{"zero1 checkpoint", checkpoint, "zero1"},
                        Case{"ddp checkpoint", reference, "zero1"}}) {
    INFO(c.label << " resumed under " << c.strategy);
    const auto got = resume(c.saved, c.strategy);
    CHECK(relDiff(got[0], base[0]) <= 1e-5);
    CHECK(at::equal(got[0], got[1]));
  }
}

TEST_CASE("zero1 refuses parameters of two dtypes with one line before training", "[zero]") {
  auto errors = runRanks("gloo", 2, [&](int, ProcessGroup& pg) {
    auto net = std::make_shared<Net>();
    net->fc2->to(at::kDouble);
    makeStrategy("zero1", pg, "sgd", net);
  });
  for (const auto& e : errors) {
    CHECK_THAT(e, Catch::Matchers::Contains("zero1: parameter 'fc2.weight' is float64 but 'fc1.weight' is float32"));
  }
}
