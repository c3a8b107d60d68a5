// DistributedDataParallel and DistributedSampler, with ranks as threads over
// the Gloo backend.
#include <ATen/CPUGeneratorImpl.h>
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

#include "framework/parallel/ddp.hpp"
#include "framework/parallel/model_sync.hpp"
#include "framework/core/errors.hpp"
#include "framework/parallel/sampler.hpp"
#include "framework/parallel/torch_compat.hpp"
#include "tests/test_support.hpp"

using namespace ddp;
using Catch::Matchers::Contains;
using ddp::test::joinErrors;
using ddp::test::runRanks;
using ddp::test::initParameters;
using ddp::test::borrow;
using ddp::test::maxAbsDiff;
using ddp::test::skipUnlessRunnable;

namespace {

const std::string kDdpBackend = "gloo";


// Named like a real model: layers.0.weight, ..., head.weight, [unused.weight].
struct Mlp : torch::nn::Module {
  torch::nn::ModuleList layers;
  torch::nn::Linear head{nullptr};
  torch::nn::Linear unused{nullptr};

  Mlp(const std::vector<int64_t>& widths, int64_t outputs, bool withUnused = false) {
    layers = register_module("layers", torch::nn::ModuleList());
    for (size_t i = 0; i + 1 < widths.size(); ++i) layers->push_back(torch::nn::Linear(widths[i], widths[i + 1]));
    head = register_module("head", torch::nn::Linear(widths.back(), outputs));
    if (withUnused) unused = register_module("unused", torch::nn::Linear(widths.back(), outputs));
  }

  at::Tensor hidden(at::Tensor x) {
    for (auto& layer : *layers) x = torch::relu(layer->as<torch::nn::Linear>()->forward(x));
    return x;
  }
  at::Tensor forward(at::Tensor x) { return head->forward(hidden(x)); }
};

// Deterministic and thread-safe: ranks run concurrently, so the global RNG
// that module constructors use gives no reproducible values.

at::Tensor flatParameters(torch::nn::Module& module) {
  std::vector<at::Tensor> pieces;
  for (auto& p : module.parameters()) pieces.push_back(p.detach().reshape({-1}).clone());
  return at::cat(pieces);
}

at::Tensor flatGradients(torch::nn::Module& module) {
  std::vector<at::Tensor> pieces;
  for (auto& p : module.parameters())
    pieces.push_back(p.grad().defined() ? p.grad().reshape({-1}).clone() : at::zeros({p.numel()}));
  return at::cat(pieces);
}

struct Data {
  at::Tensor x, y;
};

Data makeData(uint64_t seed, int64_t n, int64_t features, int64_t classes) {
  auto gen = at::detail::createCPUGenerator(seed);
  return {at::randn({n, features}, gen), at::randint(classes, {n}, gen, at::kLong)};
}

at::Tensor lossOf(Mlp& model, const at::Tensor& x, const at::Tensor& y) {
  return torch::nn::functional::cross_entropy(model.forward(x), y);
}


}  // namespace

TEST_CASE("DDP over 2 ranks matches one process with the combined batch", "[ddp]") {
  if (skipUnlessRunnable(kDdpBackend)) return;
  const bool gradientAsBucketView = GENERATE(true, false);
  INFO("gradientAsBucketView " << gradientAsBucketView);
  constexpr int kWorld = 2, kSteps = 5, kBatch = 8;
  const Data data = makeData(7, kSteps * kWorld * kBatch, 10, 3);
  auto sgdOptions = torch::optim::SGDOptions(0.1).momentum(0.9);

  // Reference: one process, batch 2B.
  auto reference = std::make_shared<Mlp>(std::vector<int64_t>{10, 32, 32}, 3);
  initParameters(*reference, 42);
  {
    torch::optim::SGD opt(reference->parameters(), sgdOptions);
    for (int k = 0; k < kSteps; ++k) {
      const int64_t from = k * kWorld * kBatch, to = from + kWorld * kBatch;
      opt.zero_grad();
      lossOf(*reference, data.x.slice(0, from, to), data.y.slice(0, from, to)).backward();
      opt.step();
    }
  }

  std::vector<std::vector<at::Tensor>> afterStep(kWorld, std::vector<at::Tensor>(kSteps));
  std::vector<size_t> buckets(kWorld);
  auto errors = runRanks(kDdpBackend, kWorld, [&](int rank, ProcessGroup& pg) {
    auto model = std::make_shared<Mlp>(std::vector<int64_t>{10, 32, 32}, 3);
    // Rank 1 starts elsewhere: the construction broadcast must fix it.
    initParameters(*model, rank == 0 ? 42 : 1000 + rank);
    DdpOptions options;
    options.bucketCapBytes = 2048;
    options.firstBucketCapBytes = 512;
    options.gradientAsBucketView = gradientAsBucketView;
    DistributedDataParallel ddp(model, borrow(pg), options);
    buckets[rank] = ddp.bucketCount();
    torch::optim::SGD opt(model->parameters(), sgdOptions);
    for (int k = 0; k < kSteps; ++k) {
      const int64_t from = (k * kWorld + rank) * kBatch, to = from + kBatch;
      opt.zero_grad();
      lossOf(*model, data.x.slice(0, from, to), data.y.slice(0, from, to)).backward();
      ddp.finishGradientSync();
      opt.step();
      afterStep[rank][k] = flatParameters(*model);
    }
  });
  INFO(joinErrors(errors));
  REQUIRE(joinErrors(errors).empty());
  CHECK(buckets[0] >= 3);
  for (int k = 0; k < kSteps; ++k) {
    INFO("step " << k);
    CHECK(at::equal(afterStep[0][k], afterStep[1][k]));
  }
  const double diff = maxAbsDiff(afterStep[0].back(), flatParameters(*reference));
  INFO("max abs diff to the single-process reference: " << diff);
  CHECK(diff <= 1e-5);
}

TEST_CASE("DDP broadcasts rank 0's parameters and buffers at construction", "[ddp]") {
  if (skipUnlessRunnable(kDdpBackend)) return;
  struct WithBuffers : torch::nn::Module {
    torch::nn::Linear fc{nullptr};
    torch::nn::BatchNorm1d bn{nullptr};
    WithBuffers() {
      fc = register_module("fc", torch::nn::Linear(6, 5));
      bn = register_module("bn", torch::nn::BatchNorm1d(5));
    }
    at::Tensor forward(const at::Tensor& x) { return bn->forward(fc->forward(x)); }
  };
  auto flatState = [](torch::nn::Module& m) {
    std::vector<at::Tensor> pieces;
    for (auto& p : m.parameters()) pieces.push_back(p.detach().reshape({-1}).to(at::kDouble));
    for (auto& b : m.buffers()) pieces.push_back(b.detach().reshape({-1}).to(at::kDouble));
    return at::cat(pieces);
  };
  constexpr int kWorld = 3;
  std::vector<at::Tensor> atStart(kWorld), afterConstruction(kWorld), afterStep(kWorld);
  auto errors = runRanks(kDdpBackend, kWorld, [&](int rank, ProcessGroup& pg) {
    auto model = std::make_shared<WithBuffers>();
    initParameters(*model, 100 + rank);
    {
      at::NoGradGuard noGrad;
      model->bn->running_mean.fill_(rank + 1.0);
      model->bn->num_batches_tracked.fill_(rank + 5);  // int64: a second dtype
    }
    atStart[rank] = flatState(*model);
    DistributedDataParallel ddp(model, borrow(pg));
    afterConstruction[rank] = flatState(*model);
    // Training-mode batch norm updates running stats from local data; the
    // sync after backward puts rank 0's back everywhere.
    const Data data = makeData(200 + rank, 8, 6, 5);
    model->forward(data.x).pow(2).mean().backward();
    ddp.finishGradientSync();
    afterStep[rank] = flatState(*model);
  });
  INFO(joinErrors(errors));
  REQUIRE(joinErrors(errors).empty());
  CHECK_FALSE(at::equal(atStart[0], atStart[1]));
  for (int r = 0; r < kWorld; ++r) {
    INFO("rank " << r);
    CHECK(at::equal(afterConstruction[r], atStart[0]));
    CHECK(at::equal(afterStep[r], afterStep[0]));
  }
}

TEST_CASE("PackedBroadcast gives every rank rank 0's values at every run, any dtype or layout", "[ddp]") {
  if (skipUnlessRunnable(kDdpBackend)) return;
  // Reused packing memory must carry each run's values, not the first's.
  constexpr int kRuns = 3;
  for (const int world : {2, 3}) {
    INFO("world size " << world);
    std::vector<std::vector<std::vector<at::Tensor>>> seen(world);  // [rank][run] -> tensors
    std::vector<at::Tensor> grown(world);
    auto errors = runRanks(kDdpBackend, world, [&](int rank, ProcessGroup& pg) {
      at::Tensor f = at::empty({5}, at::kFloat);
      at::Tensor d = at::empty({2, 3}, at::kDouble);
      at::Tensor i = at::empty({3}, at::kLong);
      at::Tensor base = at::empty({3, 4}, at::kFloat);
      at::Tensor transposed = base.t();  // not contiguous: the general path
      at::Tensor none = at::empty({0}, at::kFloat);
      PackedBroadcast packed({f, none, d, i, transposed});
      CHECK_FALSE(packed.empty());
      for (int run = 0; run < kRuns; ++run) {
        // Rank 0's values depend on the run; the others' are rank noise.
        const double v = rank == 0 ? 10.0 * run : -1.0 - rank;
        f.copy_(at::arange(5, at::kFloat) + v);
        d.copy_(at::arange(6, at::kDouble).reshape({2, 3}) * 0.5 + v);
        i.copy_(at::arange(3, at::kLong) + static_cast<int64_t>(static_cast<int64_t>(v) * int64_t{1000000000000}));
        base.copy_(at::arange(12, at::kFloat).reshape({3, 4}) - v);
        packed.run(pg, std::chrono::milliseconds(20000));
        seen[rank].push_back({f.clone(), d.clone(), i.clone(), transposed.clone()});
      }
      CHECK(PackedBroadcast({none}).empty());
      // A tensor changed under the plan (as Module::to() does, through
      // set_data): the next run plans again instead of copying by the old
      // sizes.
      f.set_data(at::full({7}, rank == 0 ? 100.0 : -1.0, at::kDouble));
      packed.run(pg, std::chrono::milliseconds(20000));
      grown[rank] = f.clone();
    });
    INFO(joinErrors(errors));
    REQUIRE(joinErrors(errors).empty());
    for (int run = 0; run < kRuns; ++run) {
      const double v = 10.0 * run;
      const std::vector<at::Tensor> expected = {at::arange(5, at::kFloat) + v,
                                                at::arange(6, at::kDouble).reshape({2, 3}) * 0.5 + v,
                                                at::arange(3, at::kLong) + static_cast<int64_t>(static_cast<int64_t>(v) * int64_t{1000000000000}),
                                                (at::arange(12, at::kFloat).reshape({3, 4}) - v).t()};
      for (int r = 0; r < world; ++r) {
        for (size_t t = 0; t < expected.size(); ++t) {
          INFO("run " << run << ", rank " << r << ", tensor " << t);
          CHECK(at::equal(seen[r][run][t], expected[t]));
        }
      }
    }
    for (int r = 0; r < world; ++r) CHECK(at::equal(grown[r], at::full({7}, 100.0, at::kDouble)));
  }
}

TEST_CASE("DDP refuses a sparse gradient with a UsageError naming the parameter", "[ddp]") {
  if (skipUnlessRunnable(kDdpBackend)) return;
  struct WithSparse : torch::nn::Module {
    torch::nn::Embedding table{nullptr};
    WithSparse() { table = register_module("table", torch::nn::Embedding(torch::nn::EmbeddingOptions(10, 4).sparse(true))); }
  };
  std::vector<std::string> messages(2);
  auto errors = runRanks(kDdpBackend, 2, [&](int rank, ProcessGroup& pg) {
    auto model = std::make_shared<WithSparse>();
    DistributedDataParallel ddp(model, borrow(pg));
    try {
      model->table->forward(at::tensor({1, 2, 3}, at::kLong)).sum().backward();
    } catch (const std::exception& e) {
      messages[rank] = e.what();
    }
  });
  INFO(joinErrors(errors));
  REQUIRE(joinErrors(errors).empty());
  for (const auto& m : messages) CHECK_THAT(m, Contains("DDP: parameter 'table.weight' has a sparse gradient"));
}

TEST_CASE("DDP names the first parameter that differs across ranks", "[ddp]") {
  if (skipUnlessRunnable(kDdpBackend)) return;
  auto expectError = [](const std::function<std::shared_ptr<Mlp>(int)>& build, const std::string& expected) {
    auto errors = runRanks(kDdpBackend, 2, [&](int rank, ProcessGroup& pg) {
      DistributedDataParallel ddp(build(rank), borrow(pg));
    });
    for (int r = 0; r < 2; ++r) {
      INFO("rank " << r << ": " << errors[r]);
      CHECK_THAT(errors[r], Contains(expected));
      CHECK_THAT(errors[r], Contains("HINT:"));
    }
  };
  SECTION("shape") {
    expectError([](int rank) { return std::make_shared<Mlp>(std::vector<int64_t>{10, 32}, rank == 0 ? 3 : 4); },
                "DDP: parameter 'head.weight' has shape [3, 32] on rank 0 but [4, 32] on rank 1");
  }
  SECTION("dtype") {
    expectError(
        [](int rank) {
          auto m = std::make_shared<Mlp>(std::vector<int64_t>{10, 32}, 3);
          if (rank == 1) m->layers[0]->to(at::kDouble);
          return m;
        },
        "DDP: parameter 'layers.0.weight' has dtype float32 on rank 0 but float64 on rank 1");
  }
  SECTION("missing parameter") {
    expectError([](int rank) { return std::make_shared<Mlp>(std::vector<int64_t>{10, 32}, 3, rank == 1); },
                "DDP: parameter 'unused.weight' exists on rank 1 but not on rank 0");
  }
}

TEST_CASE("DDP launches allreduces during backward when overlap is on", "[ddp]") {
  if (skipUnlessRunnable(kDdpBackend)) return;
  for (bool overlap : {true, false}) {
    DYNAMIC_SECTION("overlap " << overlap) {
      std::vector<DistributedDataParallel::SyncTimeline> timelines(2);
      std::vector<size_t> bucketCounts(2);
      auto errors = runRanks(kDdpBackend, 2, [&](int rank, ProcessGroup& pg) {
        auto model = std::make_shared<Mlp>(std::vector<int64_t>{256, 256, 256, 256, 256, 256}, 10);
        DdpOptions options;
        options.bucketCapBytes = 300 * 1024;
        options.firstBucketCapBytes = 64 * 1024;
        options.overlap = overlap;
        DistributedDataParallel ddp(model, borrow(pg), options);
        bucketCounts[rank] = ddp.bucketCount();
        const Data data = makeData(rank, 64, 256, 10);
        for (int step = 0; step < 3; ++step) {
          model->zero_grad();
          lossOf(*model, data.x, data.y).backward();
          ddp.finishGradientSync();
        }
        timelines[rank] = ddp.lastSyncTimeline();
      });
      INFO(joinErrors(errors));
      REQUIRE(joinErrors(errors).empty());
      REQUIRE(bucketCounts[0] >= 3);
      for (int r = 0; r < 2; ++r) {
        const auto& t = timelines[r];
        REQUIRE(t.bucketLaunch.size() == bucketCounts[0]);
        for (size_t b = 1; b < t.bucketLaunch.size(); ++b) CHECK(t.bucketLaunch[b - 1] <= t.bucketLaunch[b]);
        CHECK(t.backwardStart <= t.backwardEnd);
        CHECK(t.finishStart <= t.finishEnd);
        if (overlap) {
          CHECK(t.launchedDuringBackward[0]);
          CHECK(t.bucketLaunch[0] < t.backwardEnd);
          const auto lead = std::chrono::duration<double, std::micro>(t.backwardEnd - t.bucketLaunch[0]).count();
          INFO("rank " << r << ": first allreduce started " << lead << " us before backward ended");
          CHECK(lead > 0);
        } else {
          for (size_t b = 0; b < t.bucketLaunch.size(); ++b) {
            CHECK_FALSE(t.launchedDuringBackward[b]);
            CHECK(t.bucketLaunch[b] >= t.finishStart);
          }
        }
      }
    }
  }
}

TEST_CASE("DDP reports parameters without gradient, or zeroes them with findUnusedParameters", "[ddp]") {
  if (skipUnlessRunnable(kDdpBackend)) return;
  SECTION("default: error naming them") {
    auto errors = runRanks(kDdpBackend, 2, [&](int rank, ProcessGroup& pg) {
      auto model = std::make_shared<Mlp>(std::vector<int64_t>{10, 16}, 3, /*withUnused=*/true);
      DistributedDataParallel ddp(model, borrow(pg));
      const Data data = makeData(rank, 4, 10, 3);
      lossOf(*model, data.x, data.y).backward();
      ddp.finishGradientSync();
    });
    for (int r = 0; r < 2; ++r) {
      INFO("rank " << r << ": " << errors[r]);
      CHECK_THAT(errors[r], Contains("DDP: parameters received no gradient in this iteration: unused.bias, unused.weight"));
      CHECK_THAT(errors[r], Contains("HINT: set distributed.find_unused_parameters = true"));
    }
  }
  SECTION("findUnusedParameters: zero, or the average where some rank used them") {
    std::vector<at::Tensor> params(2), unusedGrad(2), usedOnRank0Local(2), usedOnRank0Averaged(2);
    auto errors = runRanks(kDdpBackend, 2, [&](int rank, ProcessGroup& pg) {
      auto model = std::make_shared<Mlp>(std::vector<int64_t>{10, 16}, 3, /*withUnused=*/true);
      DdpOptions options;
      options.findUnusedParameters = true;
      options.firstBucketCapBytes = 64;  // several buckets
      DistributedDataParallel ddp(model, borrow(pg), options);
      torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
      const Data data = makeData(rank, 4, 10, 3);
      for (int step = 0; step < 3; ++step) {
        opt.zero_grad();
        lossOf(*model, data.x, data.y).backward();
        ddp.finishGradientSync();
        opt.step();
      }
      unusedGrad[rank] = model->unused->weight.grad().defined() ? model->unused->weight.grad().clone() : at::Tensor();
      params[rank] = flatParameters(*model);

      // Only rank 0 uses the extra layer: both end with half its gradient.
      opt.zero_grad();
      at::Tensor loss = lossOf(*model, data.x, data.y);
      if (rank == 0) loss = loss + model->unused->forward(model->hidden(data.x)).pow(2).mean();
      // This rank's own gradient, taken without running the accumulators (so
      // no DDP hook fires). Reading .grad after backward would race: buckets
      // are reduced in place while backward and its hooks still run.
      const at::Tensor local = torch::autograd::grad({loss}, {model->unused->weight}, {}, /*retain_graph=*/true,
                                                     /*create_graph=*/false, /*allow_unused=*/true)[0];
      usedOnRank0Local[rank] = local.defined() ? local.clone() : at::zeros_like(model->unused->weight);
      loss.backward();
      ddp.finishGradientSync();
      usedOnRank0Averaged[rank] = model->unused->weight.grad().clone();
    });
    INFO(joinErrors(errors));
    REQUIRE(joinErrors(errors).empty());
    CHECK(at::equal(params[0], params[1]));
    for (int r = 0; r < 2; ++r) {
      REQUIRE(unusedGrad[r].defined());
      CHECK(unusedGrad[r].abs().max().item<double>() == 0.0);
      CHECK(at::equal(usedOnRank0Averaged[r], usedOnRank0Averaged[0]));
    }
    CHECK(usedOnRank0Local[0].abs().max().item<double>() > 0.0);
    CHECK(maxAbsDiff(usedOnRank0Averaged[0], usedOnRank0Local[0] / 2) <= 1e-7);
  }
}

TEST_CASE("DDP noSync accumulation equals one synced step on the whole batch", "[ddp]") {
  if (skipUnlessRunnable(kDdpBackend)) return;
  for (bool lastPassSynced : {true, false}) {
    DYNAMIC_SECTION((lastPassSynced ? "second micro-batch synced" : "both under noSync, then finish")) {
      std::vector<double> diffs(2, -1.0);
      std::vector<double> rankSpread(2, -1.0);
      auto errors = runRanks(kDdpBackend, 2, [&](int rank, ProcessGroup& pg) {
        constexpr int64_t kMicro = 6;
        const Data data = makeData(10 + rank, 2 * kMicro, 10, 3);
        DdpOptions options;
        options.bucketCapBytes = 1024;
        options.firstBucketCapBytes = 256;

        auto accumulated = std::make_shared<Mlp>(std::vector<int64_t>{10, 16, 16}, 3);
        initParameters(*accumulated, 5);
        DistributedDataParallel ddpA(accumulated, borrow(pg), options);
        {
          auto guard = ddpA.noSync();
          (lossOf(*accumulated, data.x.slice(0, 0, kMicro), data.y.slice(0, 0, kMicro)) / 2).backward();
          if (!lastPassSynced)
            (lossOf(*accumulated, data.x.slice(0, kMicro), data.y.slice(0, kMicro)) / 2).backward();
        }
        if (lastPassSynced) (lossOf(*accumulated, data.x.slice(0, kMicro), data.y.slice(0, kMicro)) / 2).backward();
        ddpA.finishGradientSync();

        auto whole = std::make_shared<Mlp>(std::vector<int64_t>{10, 16, 16}, 3);
        initParameters(*whole, 5);
        DistributedDataParallel ddpB(whole, borrow(pg), options);
        lossOf(*whole, data.x, data.y).backward();
        ddpB.finishGradientSync();

        diffs[rank] = maxAbsDiff(flatGradients(*accumulated), flatGradients(*whole));
      });
      INFO(joinErrors(errors));
      REQUIRE(joinErrors(errors).empty());
      for (int r = 0; r < 2; ++r) {
        INFO("rank " << r << " max abs gradient diff " << diffs[r]);
        CHECK(diffs[r] >= 0.0);
        CHECK(diffs[r] <= 1e-6);
      }
    }
  }
}

// Gradients that alias the buckets must behave like plain ones: in-place
// zeroing by the optimizer, accumulation under noSync, several steps.
TEST_CASE("DDP gradients as bucket views train exactly like copied gradients", "[ddp]") {
  if (skipUnlessRunnable(kDdpBackend)) return;
  std::vector<at::Tensor> finals(4);
  std::vector<int> aliased(4, -1);
  auto errors = runRanks(kDdpBackend, 2, [&](int rank, ProcessGroup& pg) {
    for (bool view : {true, false}) {
      auto model = std::make_shared<Mlp>(std::vector<int64_t>{10, 16, 16}, 3);
      initParameters(*model, 11);
      DdpOptions options;
      options.bucketCapBytes = 1024;
      options.firstBucketCapBytes = 256;
      options.gradientAsBucketView = view;
      DistributedDataParallel ddp(model, borrow(pg), options);
      torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(0.01));
      const void* firstGrad = nullptr;
      for (int step = 0; step < 4; ++step) {
        const Data data = makeData(100 * step + rank, 12, 10, 3);
        zeroGradients(opt);  // in place: the views must survive it
        {
          auto guard = ddp.noSync();
          (lossOf(*model, data.x.slice(0, 0, 6), data.y.slice(0, 0, 6)) / 2).backward();
        }
        (lossOf(*model, data.x.slice(0, 6), data.y.slice(0, 6)) / 2).backward();
        ddp.finishGradientSync();
        opt.step();
        if (step == 0) firstGrad = model->parameters()[0].grad().data_ptr();
      }
      aliased[2 * rank + (view ? 0 : 1)] = model->parameters()[0].grad().data_ptr() == firstGrad;
      finals[2 * rank + (view ? 0 : 1)] = flatParameters(*model);
    }
  });
  INFO(joinErrors(errors));
  REQUIRE(joinErrors(errors).empty());
  for (int rank = 0; rank < 2; ++rank) {
    INFO("rank " << rank);
    CHECK(at::equal(finals[2 * rank], finals[2 * rank + 1]));
    CHECK(aliased[2 * rank] == 1);  // the view stayed in place across steps
  }
  CHECK(at::equal(finals[0], finals[2]));
}

TEST_CASE("DDP at world size 1 leaves gradients unchanged", "[ddp]") {
  if (skipUnlessRunnable(kDdpBackend)) return;
  at::Tensor plain, synced;
  auto errors = runRanks(kDdpBackend, 1, [&](int, ProcessGroup& pg) {
    const Data data = makeData(3, 16, 10, 3);
    auto reference = std::make_shared<Mlp>(std::vector<int64_t>{10, 32, 32}, 3);
    initParameters(*reference, 9);
    lossOf(*reference, data.x, data.y).backward();
    plain = flatGradients(*reference);

    auto model = std::make_shared<Mlp>(std::vector<int64_t>{10, 32, 32}, 3);
    initParameters(*model, 9);
    DdpOptions options;
    options.bucketCapBytes = 1024;
    options.firstBucketCapBytes = 128;
    DistributedDataParallel ddp(model, borrow(pg), options);
    lossOf(*model, data.x, data.y).backward();
    ddp.finishGradientSync();
    synced = flatGradients(*model);
  });
  INFO(joinErrors(errors));
  REQUIRE(joinErrors(errors).empty());
  CHECK(at::equal(plain, synced));
}

TEST_CASE("DDP detects a missing or doubled finishGradientSync", "[ddp]") {
  if (skipUnlessRunnable(kDdpBackend)) return;
  std::vector<std::string> messages;
  auto errors = runRanks(kDdpBackend, 1, [&](int, ProcessGroup& pg) {
    auto model = std::make_shared<Mlp>(std::vector<int64_t>{10, 8}, 3);
    DistributedDataParallel ddp(model, borrow(pg));
    const Data data = makeData(1, 4, 10, 3);
    auto capture = [&](const std::function<void()>& f) {
      try {
        f();
        messages.push_back("(no error)");
      } catch (const std::exception& e) {
        messages.push_back(e.what());
      }
    };
    capture([&] { ddp.finishGradientSync(); });
    lossOf(*model, data.x, data.y).backward();
    capture([&] { lossOf(*model, data.x, data.y).backward(); });
    capture([&] { ddp.finishGradientSync(); });  // the first pass is still pending and completes
    lossOf(*model, data.x, data.y).backward();
    capture([&] {
      auto guard = ddp.noSync();
      ddp.finishGradientSync();
    });
    capture([&] { ddp.finishGradientSync(); });
  });
  INFO(joinErrors(errors));
  REQUIRE(joinErrors(errors).empty());
  REQUIRE(messages.size() == 5);
  CHECK_THAT(messages[0], Contains("finishGradientSync() called with no backward pass since the last one"));
  CHECK_THAT(messages[1], Contains("a backward pass started before finishGradientSync()"));
  CHECK(messages[2] == "(no error)");
  CHECK_THAT(messages[3], Contains("finishGradientSync() called inside noSync()"));
  CHECK(messages[4] == "(no error)");
}

namespace {

// Sums the bucket, then divides by the world size once the sum is in: the
// default's average, the long way. Counts its calls per bucket, and checks
// that it gets the bucket's parameters.
class SumThenDivide : public CommHook {
 public:
  std::vector<int> calls;
  std::vector<size_t> parameterCounts;
  std::vector<int64_t> parameterNumel;

  WorkPtr run(ProcessGroup& group, GradBucket& bucket) override {
    if (calls.size() <= bucket.index) {
      calls.resize(bucket.index + 1, 0);
      parameterCounts.resize(bucket.index + 1, 0);
      parameterNumel.resize(bucket.index + 1, 0);
    }
    ++calls[bucket.index];
    parameterCounts[bucket.index] = bucket.parameters.size();
    int64_t numel = 0;
    for (const auto& p : bucket.parameters) numel += p.numel();
    parameterNumel[bucket.index] = numel;
    AllreduceOptions sum;
    sum.op = ReduceOp::Sum;
    at::Tensor buffer = bucket.buffer;
    const double world = group.size();
    return thenWork(group.allreduce(bucket.buffer, sum), group.options().timeout, [buffer, world]() mutable {
      at::NoGradGuard noGrad;
      buffer.div_(world);
    });
  }
};

}  // namespace

TEST_CASE("a DDP comm hook replaces the bucket allreduce: same gradients, one call per bucket and synced step",
          "[ddp][comm_hook]") {
  if (skipUnlessRunnable(kDdpBackend)) return;
  constexpr int kWorld = 2, kSteps = 3;
  const bool viaRegister = GENERATE(false, true);
  INFO((viaRegister ? "registerCommHook()" : "DdpOptions::commHook"));
  std::vector<std::vector<at::Tensor>> withDefault(kWorld), withHook(kWorld);
  std::vector<std::shared_ptr<SumThenDivide>> hooks(kWorld);
  std::vector<std::vector<DistributedDataParallel::BucketInfo>> layouts(kWorld);
  auto errors = runRanks(kDdpBackend, kWorld, [&](int rank, ProcessGroup& pg) {
    for (bool custom : {false, true}) {
      auto model = std::make_shared<Mlp>(std::vector<int64_t>{10, 16, 16}, 3);
      initParameters(*model, 21);
      DdpOptions options;
      options.bucketCapBytes = 1024;
      options.firstBucketCapBytes = 256;
      auto hook = std::make_shared<SumThenDivide>();
      if (custom && !viaRegister) options.commHook = hook;
      DistributedDataParallel ddp(model, borrow(pg), options);
      if (custom && viaRegister) ddp.registerCommHook(hook);
      torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05));
      for (int step = 0; step < kSteps; ++step) {
        const Data data = makeData(50 * step + rank, 12, 10, 3);
        zeroGradients(opt);
        {
          auto guard = ddp.noSync();  // a local micro-batch: no hook call
          (lossOf(*model, data.x.slice(0, 0, 6), data.y.slice(0, 0, 6)) / 2).backward();
        }
        (lossOf(*model, data.x.slice(0, 6), data.y.slice(0, 6)) / 2).backward();
        ddp.finishGradientSync();
        (custom ? withHook : withDefault)[rank].push_back(flatGradients(*model));
        opt.step();
      }
      if (custom) {
        hooks[rank] = hook;
        layouts[rank] = ddp.bucketInfo();
      }
    }
  });
  INFO(joinErrors(errors));
  REQUIRE(joinErrors(errors).empty());
  for (int rank = 0; rank < kWorld; ++rank) {
    INFO("rank " << rank);
    REQUIRE(withHook[rank].size() == size_t(kSteps));
    for (int step = 0; step < kSteps; ++step) {
      INFO("step " << step);
      CHECK(maxAbsDiff(withHook[rank][step], withDefault[rank][step]) <= 1e-6);
      CHECK(at::equal(withHook[rank][step], withHook[0][step]));
    }
    const auto& layout = layouts[rank];
    REQUIRE(layout.size() >= 2);
    CHECK(hooks[rank]->calls == std::vector<int>(layout.size(), kSteps));
    for (size_t b = 0; b < layout.size(); ++b) {
      CHECK(hooks[rank]->parameterCounts[b] == layout[b].parameterNames.size());
      CHECK(size_t(hooks[rank]->parameterNumel[b]) == layout[b].numel);
    }
  }
}

TEST_CASE("a DDP comm hook registered after the first backward is a UsageError", "[ddp][comm_hook]") {
  if (skipUnlessRunnable(kDdpBackend)) return;
  std::string before, after;
  auto errors = runRanks(kDdpBackend, 1, [&](int, ProcessGroup& pg) {
    auto model = std::make_shared<Mlp>(std::vector<int64_t>{10, 8}, 3);
    DistributedDataParallel ddp(model, borrow(pg));
    const Data data = makeData(1, 4, 10, 3);
    try {
      ddp.registerCommHook(std::make_shared<SumThenDivide>());
      before = "(no error)";
    } catch (const std::exception& e) {
      before = e.what();
    }
    lossOf(*model, data.x, data.y).backward();
    ddp.finishGradientSync();
    try {
      ddp.registerCommHook(std::make_shared<SumThenDivide>());
      after = "(no error)";
    } catch (const UsageError& e) {
      after = e.what();
    }
  });
  INFO(joinErrors(errors));
  REQUIRE(joinErrors(errors).empty());
  CHECK(before == "(no error)");
  CHECK_THAT(after, Contains("registerCommHook() called after a backward pass") && Contains("HINT:"));
}

TEST_CASE("thenWork passes on the first Work's failure and runs nothing", "[ddp][comm_hook]") {
  auto first = std::make_shared<Work>("test op", std::chrono::milliseconds(1000));
  bool ran = false;
  WorkPtr next = thenWork(first, std::chrono::milliseconds(1000), [&] { ran = true; });
  CHECK_FALSE(next->isCompleted());
  first->finish(std::make_exception_ptr(CollectiveError("test op failed")));
  CHECK(next->isCompleted());
  CHECK_FALSE(ran);
  CHECK_THROWS_WITH(next->wait(), "test op failed");

  auto ok = std::make_shared<Work>("test op", std::chrono::milliseconds(1000));
  WorkPtr after = thenWork(ok, std::chrono::milliseconds(1000), [&] { ran = true; });
  ok->finish();
  after->wait();
  CHECK(ran);
}

TEST_CASE("averageAcrossRanks averages scalars and vectors", "[ddp]") {
  if (skipUnlessRunnable(kDdpBackend)) return;
  std::vector<double> scalar(3);
  std::vector<std::vector<double>> vec(3);
  auto errors = runRanks(kDdpBackend, 3, [&](int rank, ProcessGroup& pg) {
    scalar[rank] = averageAcrossRanks(pg, rank + 1.0);
    vec[rank] = averageAcrossRanks(pg, std::vector<double>{double(rank), 10.0 * rank});
  });
  INFO(joinErrors(errors));
  REQUIRE(joinErrors(errors).empty());
  for (int r = 0; r < 3; ++r) {
    CHECK(scalar[r] == 2.0);
    CHECK(vec[r] == std::vector<double>{1.0, 10.0});
  }
}

// ---- DistributedSampler ---------------------------------------------------

namespace {

std::vector<std::vector<int64_t>> shards(int64_t n, int world, uint64_t seed, bool dropLast, int64_t epoch = 0) {
  std::vector<std::vector<int64_t>> out;
  for (int r = 0; r < world; ++r) out.push_back(DistributedSampler(n, r, world, seed, true, dropLast).indicesForEpoch(epoch));
  return out;
}

}  // namespace

TEST_CASE("DistributedSampler shards are disjoint and cover the dataset", "[sampler]") {
  SECTION("divisible: every index exactly once") {
    auto s = shards(12, 3, 1, false);
    std::vector<int64_t> all;
    for (auto& shard : s) {
      CHECK(shard.size() == 4);
      all.insert(all.end(), shard.begin(), shard.end());
    }
    std::sort(all.begin(), all.end());
    std::vector<int64_t> expected(12);
    std::iota(expected.begin(), expected.end(), 0);
    CHECK(all == expected);
  }
  SECTION("not divisible: ceil(N/w) each, padded from the start of the permutation") {
    auto s = shards(10, 3, 1, false);
    std::map<int64_t, int> count;
    for (auto& shard : s) {
      CHECK(shard.size() == 4);
      for (auto i : shard) ++count[i];
    }
    CHECK(count.size() == 10);
    int repeated = 0;
    for (auto& [i, c] : count) repeated += c - 1;
    CHECK(repeated == 2);
    // The padding is positions 10 and 11 = the permutation's first two,
    // which are rank 0's and rank 1's first samples.
    CHECK(s[1][3] == s[0][0]);
    CHECK(s[2][3] == s[1][0]);
  }
  SECTION("dropLast: floor(N/w) each, disjoint") {
    auto s = shards(10, 3, 1, true);
    std::set<int64_t> distinct;
    for (auto& shard : s) {
      CHECK(shard.size() == 3);
      distinct.insert(shard.begin(), shard.end());
    }
    CHECK(distinct.size() == 9);
  }
  SECTION("fewer samples than ranks") {
    auto s = shards(2, 3, 1, false);
    for (auto& shard : s) CHECK(shard.size() == 1);
    CHECK(shards(2, 3, 1, true)[0].empty());
    CHECK(shards(0, 3, 1, false)[0].empty());
  }
  SECTION("without shuffle rank r takes r, r+w, ...") {
    DistributedSampler s(7, 1, 3, 0, /*shuffle=*/false);
    CHECK(s.nextEpoch() == std::vector<int64_t>{1, 4, 0});
  }
  SECTION("bad arguments") {
    CHECK_THROWS_AS(DistributedSampler(10, 3, 3), UsageError);
    CHECK_THROWS_AS(DistributedSampler(-1, 0, 1), UsageError);
  }
}

TEST_CASE("DistributedSampler reshuffles every epoch, reproducibly", "[sampler]") {
  DistributedSampler a(100, 0, 2, 17), b(100, 0, 2, 17);
  CHECK(a.epoch() == 0);
  auto e0 = a.nextEpoch();
  auto e1 = a.nextEpoch();
  CHECK(a.epoch() == 2);
  CHECK(e0 != e1);
  CHECK(b.nextEpoch() == e0);
  CHECK(b.nextEpoch() == e1);
  DistributedSampler resumed(100, 0, 2, 17);
  resumed.setEpoch(1);
  CHECK(resumed.nextEpoch() == e1);
  CHECK(DistributedSampler(100, 0, 2, 18).nextEpoch() != e0);
  // Pinned: the order must not depend on the platform or standard library.
  CHECK(DistributedSampler(10, 0, 1, 0).nextEpoch() == std::vector<int64_t>{7, 2, 0, 8, 3, 9, 6, 1, 5, 4});
}

// benchmarks/reference/distributed_sampler.py gives the PyTorch references
// our sample order; it must be the C++ sampler's, rank by rank.
TEST_CASE("the Python port of DistributedSampler gives the C++ sampler's indices", "[sampler][solo]") {
  if (!std::filesystem::exists("/usr/bin/python3")) {
    WARN("SKIPPED: /usr/bin/python3 is absent");
    return;
  }
  struct Case {
    int64_t n;
    uint64_t seed;
    int64_t epoch;
    int rank, world;
    bool dropLast;
  };
  for (const Case& c : {Case{10, 0, 0, 0, 1, false}, Case{103, 5, 2, 1, 3, false}, Case{103, 5, 2, 2, 3, true},
                        Case{2, 9, 1, 3, 4, false}, Case{3346, 1000, 7, 1, 2, false}}) {
    SpawnOptions options;
    options.argv = {"/usr/bin/python3", DDP_SOURCE_DIR "/benchmarks/reference/distributed_sampler.py",
                    std::to_string(c.n), std::to_string(c.seed), std::to_string(c.epoch), std::to_string(c.rank),
                    std::to_string(c.world)};
    if (c.dropLast) options.argv.push_back("--drop-last");
    const FinishedProcess done = runProcess(std::move(options));
    REQUIRE(WIFEXITED(done.status));
    REQUIRE(WEXITSTATUS(done.status) == 0);
    std::vector<int64_t> python;
    std::istringstream lines(done.output);
    for (int64_t i; lines >> i;) python.push_back(i);
    DistributedSampler sampler(c.n, c.rank, c.world, c.seed, true, c.dropLast);
    sampler.setEpoch(c.epoch);
    INFO("n " << c.n << " seed " << c.seed << " epoch " << c.epoch << " rank " << c.rank << "/" << c.world);
    CHECK(python == sampler.nextEpoch());
  }
}

TEST_CASE("uneven inputs: ranks without a batch shadow the step and the average counts only the others",
          "[ddp][join]") {
  if (skipUnlessRunnable(kDdpBackend)) return;
  // 10 samples at 3 ranks, unpadded: rank 0 reads 4, ranks 1 and 2 read 3.
  // Batches of 3: rank 0 has two steps (3 and 1 samples), the others one,
  // so they shadow rank 0's second step.
  constexpr int kWorld = 3;
  const Data all = makeData(77, 10, 10, 3);
  auto batchesOf = [&](int rank) {
    std::vector<int64_t> mine;
    for (int64_t i = rank; i < 10; i += kWorld) mine.push_back(i);
    std::vector<std::vector<int64_t>> batches;
    for (size_t b = 0; b < mine.size(); b += 3) {
      batches.emplace_back(mine.begin() + b, mine.begin() + std::min(mine.size(), b + 3));
    }
    return batches;
  };
  auto take = [&](const at::Tensor& t, const std::vector<int64_t>& rows) {
    return t.index_select(0, at::tensor(rows, at::kLong));
  };
  const size_t steps = batchesOf(0).size();
  REQUIRE(steps == 2);
  REQUIRE(batchesOf(1).size() == 1);

  std::vector<std::vector<at::Tensor>> grads(kWorld), params(kWorld);
  auto errors = runRanks(kDdpBackend, kWorld, [&](int rank, ProcessGroup& pg) {
    auto model = std::make_shared<Mlp>(std::vector<int64_t>{10, 8}, 3);
    initParameters(*model, 9);
    DdpOptions options;
    options.bucketCapBytes = 200;  // several buckets
    DistributedDataParallel ddp(model, borrow(pg), options);
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
    const auto mine = batchesOf(rank);
    for (size_t step = 0; step < steps; ++step) {
      int contributors = 0;
      for (int r = 0; r < kWorld; ++r) contributors += batchesOf(r).size() > step ? 1 : 0;
      zeroGradients(opt);
      ddp.setContributors(contributors);
      if (step < mine.size()) {
        lossOf(*model, take(all.x, mine[step]), take(all.y, mine[step])).backward();
      } else {
        ddp.shadowBackward();
      }
      ddp.finishGradientSync();
      grads[rank].push_back(flatGradients(*model));
      opt.step();
    }
    params[rank].push_back(flatParameters(*model));
  });
  INFO(joinErrors(errors));
  REQUIRE(joinErrors(errors).empty());

  // The reference, in one process: each step, the mean of the contributing
  // ranks' batch gradients, then the same SGD step.
  auto model = std::make_shared<Mlp>(std::vector<int64_t>{10, 8}, 3);
  initParameters(*model, 9);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
  for (size_t step = 0; step < steps; ++step) {
    at::Tensor sum;
    int contributors = 0;
    for (int r = 0; r < kWorld; ++r) {
      const auto batches = batchesOf(r);
      if (batches.size() <= step) continue;
      zeroGradients(opt);
      lossOf(*model, take(all.x, batches[step]), take(all.y, batches[step])).backward();
      const at::Tensor g = flatGradients(*model);
      sum = sum.defined() ? sum + g : g;
      ++contributors;
    }
    const at::Tensor want = sum / contributors;
    for (int r = 0; r < kWorld; ++r) {
      INFO("step " << step << ", rank " << r);
      CHECK(maxAbsDiff(grads[r][step], want) <= 1e-6);
    }
    // Apply the reference's mean gradient.
    int64_t offset = 0;
    for (auto& p : model->parameters()) {
      p.mutable_grad() = want.narrow(0, offset, p.numel()).view(p.sizes()).clone();
      offset += p.numel();
    }
    opt.step();
  }
  for (int r = 0; r < kWorld; ++r) CHECK(maxAbsDiff(params[r][0], flatParameters(*model)) <= 1e-6);
}

TEST_CASE("shadowBackward after a backward, and setContributors out of range, are UsageErrors", "[ddp][join]") {
  if (skipUnlessRunnable(kDdpBackend)) return;
  std::string twice, range;
  auto errors = runRanks(kDdpBackend, 1, [&](int, ProcessGroup& pg) {
    auto model = std::make_shared<Mlp>(std::vector<int64_t>{10, 8}, 3);
    DistributedDataParallel ddp(model, borrow(pg));
    const Data data = makeData(1, 4, 10, 3);
    lossOf(*model, data.x, data.y).backward();
    try {
      ddp.shadowBackward();
    } catch (const UsageError& e) {
      twice = e.what();
    }
    try {
      ddp.setContributors(2);
    } catch (const UsageError& e) {
      range = e.what();
    }
  });
  INFO(joinErrors(errors));
  REQUIRE(joinErrors(errors).empty());
  CHECK_THAT(twice, Contains("shadowBackward()") && Contains("HINT:"));
  CHECK_THAT(range, Contains("setContributors(2) outside 1..1"));
}

TEST_CASE("DistributedSampler without padding reads every sample exactly once per epoch", "[sampler][join]") {
  for (int64_t n : {0, 2, 7, 10, 11}) {
    for (int world = 1; world <= 4; ++world) {
      INFO(n << " samples, " << world << " ranks");
      std::vector<int64_t> seen;
      for (int r = 0; r < world; ++r) {
        DistributedSampler sampler(n, r, world, /*seed=*/3, /*shuffle=*/true, /*dropLast=*/false, /*pad=*/false);
        const auto mine = sampler.indicesForEpoch(1);
        CHECK(int64_t(mine.size()) == DistributedSampler::samplesFor(n, r, world, false, false));
        CHECK(int64_t(mine.size()) == n / world + (r < n % world ? 1 : 0));
        seen.insert(seen.end(), mine.begin(), mine.end());
      }
      std::sort(seen.begin(), seen.end());
      std::vector<int64_t> all(static_cast<size_t>(n));
      std::iota(all.begin(), all.end(), int64_t{0});
      CHECK(seen == all);
    }
  }
}
