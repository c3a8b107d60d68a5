// Sharded strategies (zero1, zero2, fsdp) against DDP: the same parameters after the
// same steps, state about 1/world of DDP's, and consolidated checkpoints
// that resume under another strategy and world size. Ranks are threads
// over the gloo backend.
#include <ATen/CPUGeneratorImpl.h>
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <sstream>

#include "framework/core/errors.hpp"
#include "framework/parallel/flat_shards.hpp"
#include "framework/parallel/fsdp_strategy.hpp"
#include "framework/parallel/sharding_units.hpp"
#include "framework/parallel/optimizer_state.hpp"
#include "framework/parallel/strategy.hpp"
#include "framework/parallel/strategy_footprint.hpp"
#include "framework/parallel/zero_strategy.hpp"
#include "framework/comm/sub_groups.hpp"
#include "tests/sharding_support.hpp"
#include "tests/test_support.hpp"

using namespace ddp;
using ddp::test::joinErrors;
using ddp::test::runRanks;
using ddp::test::initParameters;
using ddp::test::borrow;
using namespace ddp::test;

namespace {

// Parameters (and buffers) of every rank after `steps` steps of `strategy`.
std::vector<at::Tensor> run(const std::string& strategy, const std::string& opt, int world, int steps,
                            std::vector<int64_t>* stateBytes = nullptr, std::vector<int64_t>* gradBytes = nullptr,
                            int micro = 1) {
  const ZeroData data = makeZeroData(64 * kBatch);
  std::vector<at::Tensor> out(world);
  if (stateBytes) stateBytes->assign(world, 0);
  if (gradBytes) gradBytes->assign(world, 0);
  auto errors = runRanks("gloo", world, [&](int rank, ProcessGroup& pg) {
    auto net = std::make_shared<Net>();
    initParameters(*net, rank == 0 ? 42 : 1000 + rank);  // the strategy must start everyone from rank 0's
    auto s = makeStrategy(strategy, pg, opt, net);
    trainSteps(*s, data, rank, world, 0, steps, micro);
    s->withFullParameters([&] { out[rank] = flatState(*net); });
    if (stateBytes) (*stateBytes)[rank] = optimizerStateBytes(s->optimizer());
    if (gradBytes) (*gradBytes)[rank] = s->heldBytes().gradients;
  });
  INFO(joinErrors(errors));
  REQUIRE(joinErrors(errors).empty());
  return out;
}

}  // namespace

TEST_CASE("FlatShards: buckets of equal slices, pieces tile every parameter in rank order", "[zero]") {
  const std::vector<int64_t> numels = {0, 1, 5, 7, 0, 3, 20};  // 36 elements
  for (int64_t cap : {0, 6, 8, 100}) {
    for (int world = 1; world <= 5; ++world) {
      INFO("cap " << cap << ", world " << world);
      FlatShards s(numels, world, cap);
      CHECK(s.total() == 36);
      int64_t shard = 0, padded = 0;
      for (const auto& b : s.buckets()) {
        int64_t length = 0;
        for (size_t i = b.firstParam; i < b.endParam; ++i) length += numels[i];
        CHECK(b.length == length);
        CHECK(b.slice == std::max<int64_t>(1, (length + world - 1) / world));
        CHECK(b.offset == padded);
        CHECK(b.shardOffset == shard);
        // A bucket over the cap holds one parameter only.
        if (cap > 0 && length > cap) CHECK(b.endParam - b.firstParam == 1);
        shard += b.slice;
        padded += b.padded(world);
      }
      CHECK(s.shardSize() == shard);
      CHECK(s.paddedTotal() == padded);
      if (cap == 0) CHECK(s.buckets().size() == 1);
      for (size_t i = 0; i < numels.size(); ++i) {
        const auto& b = s.buckets()[s.bucketOf(i)];
        int64_t next = 0;  // pieces must continue where the last one ended
        for (int r = 0; r < world; ++r) {
          auto piece = s.pieceOf(i, r);
          if (!piece) continue;
          CHECK(piece->paramOffset == next);
          CHECK(piece->length > 0);
          // Rank r's slice of the bucket, in the flat space and in its shard.
          CHECK(s.offset(i) + piece->paramOffset == b.offset + r * b.slice + (piece->shardOffset - b.shardOffset));
          CHECK(piece->shardOffset >= b.shardOffset);
          CHECK(piece->shardOffset + piece->length <= b.shardOffset + b.slice);
          next += piece->length;
        }
        CHECK(next == numels[i]);
      }
    }
  }
  FlatShards empty({}, 3);
  CHECK(empty.total() == 0);
  CHECK(empty.buckets().empty());
  CHECK_FALSE(FlatShards({2}, 3).pieceOf(0, 2).has_value());  // the last rank owns only padding
}

TEST_CASE("zero1, zero2 and fsdp end every step with DDP's parameters, holding 1/world of its optimizer state",
          "[zero]") {
  const std::string strategy = GENERATE("zero1", "zero2", "fsdp");
  const std::string opt = GENERATE("sgd", "adam", "adamw");
  const int world = GENERATE(1, 2, 3, 4);
  INFO(strategy << ", " << opt << ", world " << world);
  constexpr int kSteps = 4;
  std::vector<int64_t> zeroBytes, ddpBytes, zeroGrads;
  const auto zero = run(strategy, opt, world, kSteps, &zeroBytes, &zeroGrads);
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
    INFO("rank " << r << ": " << strategy << " " << zeroBytes[r] << " B, ddp " << ddpBytes[r] << " B");
    // 64-byte buckets pad each of their slices: a few elements more.
    CHECK(zeroBytes[r] <= (shard + (strategy != "zero1" ? 8 : 0)) * perElement + 64);
    CHECK(ddpBytes[r] >= 115 * perElement);
    // zero2 and fsdp keep only their gradient shard between steps.
    if (strategy != "zero1") CHECK(zeroGrads[r] <= (shard + 8) * 4);
  }
}

TEST_CASE("hsdp on every rank mesh ends every step with DDP's parameters, holding 1/row of them",
          "[zero][subgroups]") {
  const std::string opt = GENERATE("sgd", "adam");
  struct Mesh {
    int replicate, shard;
  };
  for (const Mesh m : {Mesh{2, 2}, Mesh{4, 1}, Mesh{1, 4}, Mesh{2, 1}, Mesh{1, 2}}) {
    const int world = m.replicate * m.shard;
    INFO(opt << ", mesh " << m.replicate << " x " << m.shard);
    constexpr int kSteps = 4;
    const ZeroData data = makeZeroData(64 * kBatch);
    std::vector<at::Tensor> out(static_cast<size_t>(world));
    std::vector<int64_t> grads(static_cast<size_t>(world));
    auto store = std::make_shared<HashStore>();
    store->setTimeout(std::chrono::milliseconds(30000));
    std::vector<std::string> errors(static_cast<size_t>(world));
    std::vector<std::thread> threads;
    for (int rank = 0; rank < world; ++rank) {
      threads.emplace_back([&, rank] {
        try {
          GroupFactory groups(store, builtinBackends(), "gloo", rank, world);
          RankMesh mesh = groups.mesh(m.replicate, m.shard);
          auto net = std::make_shared<Net>();
          initParameters(*net, rank == 0 ? 42 : 1000 + rank);  // every rank starts from rank 0's
          StrategyContext c;
          c.model = net;
          c.optimizer = referenceOptimizer(opt, net->parameters());
          c.group = mesh.shardGroup;
          c.replicateGroup = mesh.replicateGroup;
          c.ddp.bucketCapBytes = kBucketBytes;
          auto strategy = builtinStrategies().create("hsdp", std::move(c));
          if (std::string(strategy->name()) != "hsdp") throw std::runtime_error("not named hsdp");
          trainSteps(*strategy, data, rank, world, 0, kSteps);
          strategy->withFullParameters([&] { out[static_cast<size_t>(rank)] = flatState(*net); });
          grads[static_cast<size_t>(rank)] = strategy->heldBytes().gradients;
        } catch (const std::exception& e) {
          errors[static_cast<size_t>(rank)] = e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
    INFO(joinErrors(errors));
    REQUIRE(joinErrors(errors).empty());
    const auto reference = run("ddp", opt, world, kSteps);
    for (int r = 0; r < world; ++r) {
      INFO("rank " << r);
      CHECK(at::equal(out[static_cast<size_t>(r)], out[0]));
      // fc1.bias (elements 70..76) gets a gradient that batch norm makes 0
      // up to rounding: summed in another order (rows, then columns), Adam
      // turns that rounding into lr-sized steps (as in the micro-batch test
      // below). Every other parameter must match DDP's.
      const at::Tensor mine = out[static_cast<size_t>(r)], ddp = reference[0];
      const at::Tensor keep = at::cat({at::arange(0, 70), at::arange(77, mine.numel())});
      CHECK(relDiff(mine.index_select(0, keep), ddp.index_select(0, keep)) <= 1e-5);
      if (opt == "sgd") CHECK(relDiff(mine, ddp) <= 1e-5);
      CHECK(grads[static_cast<size_t>(r)] <= ((115 + m.shard - 1) / m.shard + 8) * 4);
    }
  }
  // Without a mesh, hsdp says what it needs.
  auto errors = runRanks("gloo", 1, [&](int, ProcessGroup& pg) {
    auto net = std::make_shared<Net>();
    makeStrategy("hsdp", pg, "sgd", net);
  });
  CHECK_THAT(errors[0], Catch::Contains("strategy hsdp needs a rank mesh"));
}

// zero2 reduces every micro-batch into its shard; DDP accumulates locally
// (noSync) and reduces once. (Against one batch of 4 they would differ by
// design: batch norm's statistics are per micro-batch.) The two sum in
// different orders, so SGD: Adam would blow the rounding of fc1.bias's
// gradient, which batch norm makes zero up to rounding, into lr-sized steps.
TEST_CASE("zero2 and fsdp accumulate micro-batches as DDP does", "[zero]") {
  const int world = GENERATE(2, 3);
  const std::string strategy = GENERATE("zero2", "fsdp");
  INFO(strategy << ", world " << world);
  const auto zero = run(strategy, "sgd", world, 3, nullptr, nullptr, 2);
  const auto reference = run("ddp", "sgd", world, 3, nullptr, nullptr, 2);
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r);
    CHECK(relDiff(zero[r], reference[0]) <= 1e-5);
  }
}

TEST_CASE("a zero1, zero2 or fsdp checkpoint is consolidated: it resumes under any strategy at another world size",
          "[zero]") {
  const std::string opt = GENERATE("sgd", "adam");
  const std::string saver = GENERATE("zero1", "zero2", "fsdp");
  INFO(opt << ", saved under " << saver);
  const ZeroData data = makeZeroData(64 * kBatch);
  // 3 steps at world 3 under `strategy`; rank 0's checkpoint, serialized.
  auto trainAndSave = [&](const std::string& strategy) {
    std::string saved;
    auto errors = runRanks("gloo", 3, [&](int rank, ProcessGroup& pg) {
      auto net = std::make_shared<Net>();
      initParameters(*net, 42);
      auto s = makeStrategy(strategy, pg, opt, net);
      trainSteps(*s, data, rank, 3, 0, 3);
      torch::serialize::OutputArchive archive;
      s->saveState(rank == 0 ? &archive : nullptr);
      if (rank == 0) {
        std::ostringstream bytes;
        archive.save_to(bytes);
        saved = bytes.str();
      }
    });
    INFO(joinErrors(errors));
    REQUIRE(joinErrors(errors).empty());
    return saved;
  };
  const std::string checkpoint = trainAndSave(saver);
  const std::string reference = trainAndSave("ddp");

  // Both resumed for 2 more steps at world 2, under each strategy: all four
  // end alike (a checkpoint that lost or misplaced state would not).
  auto resume = [&](const std::string& saved, const std::string& strategy) {
    std::vector<at::Tensor> out(2);
    auto errs = runRanks("gloo", 2, [&](int rank, ProcessGroup& pg) {
      auto net = std::make_shared<Net>();
      auto optimizer = referenceOptimizer(opt, net->parameters());
      std::istringstream bytes(saved);
      torch::serialize::InputArchive archive;
      archive.load_from(bytes);
      loadModelAndOptimizer(archive, *net, *optimizer);
      StrategyContext c;
      c.model = net;
      c.optimizer = std::move(optimizer);
      c.group = borrow(pg);
      auto s = builtinStrategies().create(strategy, std::move(c));
      trainSteps(*s, data, rank, 2, 3, 5);
      s->withFullParameters([&] { out[rank] = flatState(*net); });
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
  for (const Case& c : {Case{"sharded checkpoint", checkpoint, "ddp"}, Case{"sharded checkpoint", checkpoint, "zero1"},
                        Case{"sharded checkpoint", checkpoint, "zero2"}, Case{"sharded checkpoint", checkpoint, "fsdp"},
                        Case{"ddp checkpoint", reference, "zero1"}, Case{"ddp checkpoint", reference, "zero2"},
                        Case{"ddp checkpoint", reference, "fsdp"}}) {
    INFO(c.label << " resumed under " << c.strategy);
    const auto got = resume(c.saved, c.strategy);
    CHECK(relDiff(got[0], base[0]) <= 1e-5);
    CHECK(at::equal(got[0], got[1]));
  }
}

TEST_CASE("zero1, zero2 and fsdp refuse parameters of two dtypes with one line before training", "[zero]") {
  const std::string strategy = GENERATE("zero1", "zero2", "fsdp");
  auto errors = runRanks("gloo", 2, [&](int, ProcessGroup& pg) {
    auto net = std::make_shared<Net>();
    net->fc2->to(at::kDouble);
    makeStrategy(strategy, pg, "sgd", net);
  });
  const std::string expected = strategy + ": parameter 'fc2.weight' is float64 but 'fc1.weight' is float32";
  for (const auto& e : errors) CHECK_THAT(e, Catch::Matchers::Contains(expected));
}

TEST_CASE("zero1, zero2 and fsdp refuse a sparse embedding before training", "[zero]") {
  const std::string strategy = GENERATE("zero1", "zero2", "fsdp");
  struct WithEmbedding : torch::nn::Module {
    torch::nn::Embedding table{nullptr};
    WithEmbedding() { table = register_module("table", torch::nn::Embedding(torch::nn::EmbeddingOptions(10, 4).sparse(true))); }
  };
  auto errors = runRanks("gloo", 2, [&](int, ProcessGroup& pg) {
    auto net = std::make_shared<WithEmbedding>();
    StrategyContext c;
    c.model = net;
    c.optimizer = referenceOptimizer("sgd", net->parameters());
    c.group = borrow(pg);
    builtinStrategies().create(strategy, std::move(c));
  });
  for (const auto& e : errors) {
    CHECK_THAT(e, Catch::Matchers::Contains(strategy + ": module 'table' is an embedding with sparse gradients"));
  }
}

// The formulas of docs/performance.md's large-model table are the layout's:
// they must give exactly what the strategies hold.
TEST_CASE("strategyFootprint gives what ddp, zero1, zero2 and fsdp hold on rank 0", "[zero]") {
  const std::string strategy = GENERATE("ddp", "zero1", "zero2", "fsdp");
  const int world = GENERATE(1, 2, 3, 4);
  INFO(strategy << ", world " << world);
  const ZeroData data = makeZeroData(64 * kBatch);
  ParallelStrategy::HeldBytes held;
  std::vector<int64_t> numels;
  auto errors = runRanks("gloo", world, [&](int rank, ProcessGroup& pg) {
    auto net = std::make_shared<Net>();
    initParameters(*net, 42);
    auto s = makeStrategy(strategy, pg, "adam", net);
    trainSteps(*s, data, rank, world, 0, 2);
    if (rank == 0) {
      held = s->heldBytes();
      for (const auto& p : net->parameters()) numels.push_back(p.numel());
    }
  });
  REQUIRE(joinErrors(errors).empty());
  const StrategyFootprint f = strategyFootprint(strategy, numels, world, 4, 2, kBucketBytes, kNetUnits);
  CHECK(f.parameterBytes == held.parameters);
  CHECK(f.gradientBytes == held.gradients);
  CHECK(f.optimizerBytes == held.optimizerState);
  // An allreduce's worth of the 115 elements (padding adds a little).
  if (world == 1) CHECK(f.sentBytesPerStep == 0);
  if (world > 1) CHECK(f.sentBytesPerStep >= 2 * (115 * 4 * (world - 1) / world));
}

TEST_CASE("zero1, zero2, fsdp: the optimizer's zero_grad works, a parameter moved off the flat buffer is an error",
          "[zero]") {
  const std::string strategy = GENERATE("zero1", "zero2", "fsdp");
  INFO(strategy);
  const ZeroData data = makeZeroData(64 * kBatch);
  auto errors = runRanks("gloo", 2, [&](int rank, ProcessGroup& pg) {
    auto net = std::make_shared<Net>();
    initParameters(*net, 42);
    auto s = makeStrategy(strategy, pg, "adam", net);
    trainSteps(*s, data, rank, 2, 0, 1);
    s->optimizer().zero_grad();  // LibTorch 1.x detaches gradients in place: views would refuse
    trainSteps(*s, data, rank, 2, 1, 2);
    {
      at::NoGradGuard noGrad;
      net->fc1->weight.set_(at::zeros_like(net->fc1->weight));  // as model.load() does
    }
    at::Tensor loss = torch::nn::functional::cross_entropy(net->forward(data.x.slice(0, 0, 4)), data.y.slice(0, 0, 4));
    s->backward(loss, true);
    s->step();
  });
  for (const auto& e : errors) CHECK_THAT(e, Catch::Matchers::Contains(strategy + ": parameter #"));
  for (const auto& e : errors) {
    CHECK_THAT(e, Catch::Matchers::Contains(strategy == "fsdp" ? "no longer lives in the strategy's unit buffer"
                                                               : "no longer lives in the strategy's flat buffer"));
  }
}

// Optimizer state must never be dropped from a checkpoint: when rank 0
// holds none of it (its slice has only parameters the optimizer does not
// train), saving is refused with one line.
TEST_CASE("zero1 refuses to save when rank 0 holds no optimizer state but others do", "[zero]") {
  const ZeroData data = makeZeroData(64 * kBatch);
  std::vector<std::string> saveErrors(2);
  auto errors = runRanks("gloo", 2, [&](int rank, ProcessGroup& pg) {
    auto net = std::make_shared<Net>();
    initParameters(*net, 42);
    StrategyContext c;
    c.model = net;
    // fc1 (rank 0's slice) is not in the optimizer: only fc2 is trained.
    c.optimizer = referenceOptimizer("adam", net->fc2->parameters());
    c.group = borrow(pg);
    auto s = builtinStrategies().create("zero1", std::move(c));
    trainSteps(*s, data, rank, 2, 0, 2);
    torch::serialize::OutputArchive archive;
    try {
      s->saveState(rank == 0 ? &archive : nullptr);
    } catch (const UsageError& e) {
      saveErrors[rank] = e.what();
    }
  });
  REQUIRE(joinErrors(errors).empty());
  CHECK_THAT(saveErrors[0], Catch::Matchers::Contains("zero1: rank 0 holds no optimizer state while other ranks do"));
  CHECK(saveErrors[1].empty());
}
