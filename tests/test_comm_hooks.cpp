// The built-in communication hooks (plugins/comm_hooks): each against the
// exact average it approximates, with ranks as threads over the Gloo
// backend; PowerSGD's error feedback on a fixed problem; the experiment key
// distributed.comm_hook; and the wine and digits runs with each hook.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <fstream>
#include <map>
#include <regex>

#include <nlohmann/json.hpp>

#include "framework/experiment/experiment_config.hpp"
#include "framework/parallel/ddp.hpp"
#include "framework/parallel/torch_compat.hpp"
#include "plugins/builtin.hpp"
#include "plugins/comm_hooks/cast_hook.hpp"
#include "plugins/comm_hooks/powersgd_hook.hpp"
#include "tests/test_support.hpp"

using namespace ddp;
using Catch::Matchers::Contains;
using ddp::plugins::CastHook;
using ddp::plugins::PowerSgdHook;
using ddp::test::joinErrors;
using ddp::test::runRanks;
using ddp::test::skipUnlessRunnable;

namespace {

const std::string kHooksBackend = "gloo";
const Milliseconds kTimeout{30000};


// Rank r's gradients: smooth, different on every rank, every element nonzero.
at::Tensor rankGradients(int rank, int64_t numel, int step = 0) {
  return at::arange(numel, at::kFloat).mul(0.37 + 0.11 * rank + 0.05 * step).sin().add(0.01 * (rank + 1));
}

double relativeError(const at::Tensor& got, const at::Tensor& want) {
  return (got - want).norm().item<double>() / want.norm().item<double>();
}

// Runs `hook` (made per rank) over one bucket of `shapes` at `world` ranks
// for `steps` steps, the bucket holding gradient(rank, step, numel) (by
// default rankGradients); returns each rank's results, step by step.
using GradientOf = std::function<at::Tensor(int rank, int step, int64_t numel)>;
std::vector<std::vector<at::Tensor>> runHook(int world, const std::vector<std::vector<int64_t>>& shapes, int steps,
                                             const std::function<CommHookPtr()>& makeHook,
                                             const GradientOf& gradient = {}) {
  std::vector<std::vector<at::Tensor>> results(world);
  auto errors = runRanks(kHooksBackend, world, [&](int rank, ProcessGroup& pg) {
    std::vector<at::Tensor> parameters;
    int64_t numel = 0;
    for (const auto& shape : shapes) {
      parameters.push_back(at::zeros(shape));
      numel += parameters.back().numel();
    }
    CommHookPtr hook = makeHook();
    for (int step = 0; step < steps; ++step) {
      at::Tensor buffer = gradient ? gradient(rank, step, numel) : rankGradients(rank, numel, step);
      GradBucket bucket{0, buffer, parameters};
      hook->run(pg, bucket)->wait();
      results[rank].push_back(buffer.clone());
    }
  });
  INFO(joinErrors(errors));
  REQUIRE(joinErrors(errors).empty());
  return results;
}

at::Tensor exactAverage(int world, int64_t numel, int step = 0) {
  at::Tensor sum = at::zeros({numel});
  for (int r = 0; r < world; ++r) sum += rankGradients(r, numel, step);
  return sum / world;
}

}  // namespace

TEST_CASE("fp16 and bf16 hooks give the average to their precision, the same on every rank", "[comm_hook]") {
  if (skipUnlessRunnable(kHooksBackend)) return;
  const int world = GENERATE(2, 3);
  const bool half = GENERATE(true, false);
  const int64_t numel = GENERATE(int64_t(1), int64_t(1000), int64_t(70000));
  INFO("world " << world << ", " << (half ? "fp16" : "bf16") << ", " << numel << " elements");
  auto results = runHook(world, {{numel}}, 1, [&] {
    return std::make_shared<CastHook>(half ? at::kHalf : at::kBFloat16, kTimeout);
  });
  const at::Tensor want = exactAverage(world, numel);
  at::Tensor magnitude = at::zeros({numel});  // the mean of |x_r|: sums may cancel, roundings do not
  for (int r = 0; r < world; ++r) magnitude += rankGradients(r, numel).abs() / world;
  for (int r = 0; r < world; ++r) {
    CHECK(at::equal(results[r][0], results[0][0]));
    // Each 16-bit rounding is within 2^-11 (fp16) or 2^-8 (bf16) of the
    // value rounded: the world's inputs, then each partial sum.
    const double unit = half ? 1.0 / 2048 : 1.0 / 256;
    CHECK(((results[r][0] - want).abs() / magnitude).max().item<double>() <= 2 * world * unit);
  }
  // Not the exact average: the test sees the rounding, so it could fail.
  if (numel == 70000) CHECK_FALSE(at::equal(results[0][0], want));
}

TEST_CASE("powersgd at full rank reconstructs the exact average through both allreduces", "[comm_hook]") {
  if (skipUnlessRunnable(kHooksBackend)) return;
  const int world = GENERATE(2, 3);
  INFO("world " << world);
  // Every matrix has min(rows, cols) = 4: at rank 4, P Q^T is exact. A
  // vector rides along exactly.
  const std::vector<std::vector<int64_t>> shapes = {{6, 4}, {5}, {4, 3, 2}, {4, 4}};
  PowerSgdHook::Options o;
  o.rank = 4;
  o.startSteps = 0;
  o.minCompressionRate = 0;  // compress even what does not shrink
  o.timeout = kTimeout;
  auto results = runHook(world, shapes, 3, [&] { return std::make_shared<PowerSgdHook>(o); });
  for (int step = 0; step < 3; ++step) {
    const at::Tensor want = exactAverage(world, 24 + 5 + 24 + 16, step);
    for (int r = 0; r < world; ++r) {
      INFO("step " << step << ", rank " << r);
      CHECK(relativeError(results[r][step], want) <= 1e-4);
      CHECK(at::allclose(results[r][step], results[0][step], 0, 1e-6));
    }
  }
}

TEST_CASE("powersgd averages exactly during its start steps and for vectors", "[comm_hook]") {
  if (skipUnlessRunnable(kHooksBackend)) return;
  PowerSgdHook::Options o;
  o.rank = 1;
  o.startSteps = 2;
  o.timeout = kTimeout;
  auto matrix = runHook(2, {{16, 16}}, 3, [&] { return std::make_shared<PowerSgdHook>(o); });
  CHECK(relativeError(matrix[0][0], exactAverage(2, 256, 0)) <= 1e-6);
  CHECK(relativeError(matrix[0][1], exactAverage(2, 256, 1)) <= 1e-6);
  CHECK(relativeError(matrix[0][2], exactAverage(2, 256, 2)) > 1e-2);  // compressed from step 3 on
  CHECK(at::equal(matrix[0][2], matrix[1][2]));

  auto vectors = runHook(2, {{16}, {7}}, 3, [&] { return std::make_shared<PowerSgdHook>(o); });
  for (int step = 0; step < 3; ++step) CHECK(relativeError(vectors[1][step], exactAverage(2, 23, step)) <= 1e-6);
}

TEST_CASE("powersgd's error feedback makes the accumulated update converge to the exact one", "[comm_hook]") {
  if (skipUnlessRunnable(kHooksBackend)) return;
  // Fixed full-rank gradients (the same every step) at rank 1: one step is
  // far off, but what compression loses is fed into the next step, so the
  // mean of K applied updates approaches the true average as 1/K.
  constexpr int kSteps = 64;
  const int64_t n = 16;
  PowerSgdHook::Options o;
  o.rank = 1;
  o.startSteps = 0;
  o.timeout = kTimeout;
  // The same gradients every step.
  const auto results = runHook(2, {{n, n}}, kSteps, [&] { return std::make_shared<PowerSgdHook>(o); },
                               [](int rank, int, int64_t numel) { return rankGradients(rank, numel); });
  const at::Tensor want = exactAverage(2, n * n);
  auto meanOfFirst = [&](int k) {
    at::Tensor sum = at::zeros({n * n});
    for (int i = 0; i < k; ++i) sum += results[0][i];
    return sum / k;
  };
  const double one = relativeError(results[0][0], want);
  const double at8 = relativeError(meanOfFirst(8), want);
  const double at64 = relativeError(meanOfFirst(kSteps), want);
  INFO("relative error: one step " << one << ", mean of 8 " << at8 << ", mean of 64 " << at64);
  CHECK(one > 0.2);
  CHECK(at64 < at8);
  CHECK(at64 < 0.05);
  CHECK(at::equal(results[0].back(), results[1].back()));
}

TEST_CASE("powersgd recovers from a first step of zero gradients", "[comm_hook]") {
  if (skipUnlessRunnable(kHooksBackend)) return;
  // A zero gradient makes P and then Q zero; kept as the warm start, a
  // zero Q would make every later P zero, and the matrix would never train.
  const int64_t n = 16;
  PowerSgdHook::Options o;
  o.rank = 2;
  o.startSteps = 0;
  o.timeout = kTimeout;
  const auto results = runHook(2, {{n, n}}, 4, [&] { return std::make_shared<PowerSgdHook>(o); },
                               [](int rank, int step, int64_t numel) {
                                 return step == 0 ? at::zeros({numel}) : rankGradients(rank, numel);
                               });
  const at::Tensor want = exactAverage(2, n * n);
  CHECK(results[0][0].abs().max().item<double>() == 0);
  for (int step = 1; step < 4; ++step) {
    INFO("step " << step);
    CHECK(results[0][step].isfinite().all().item<bool>());
    CHECK(relativeError(results[0][step], want) < 0.9);  // a zero result would be 1
  }
}

TEST_CASE("DDP with each hook: full-rank powersgd and fp16 match the exact gradients across buckets",
          "[comm_hook][ddp]") {
  if (skipUnlessRunnable(kHooksBackend)) return;
  const std::string which = GENERATE(std::string("powersgd"), std::string("fp16"));
  INFO(which);
  constexpr int kWorld = 2, kSteps = 3;
  struct Square : torch::nn::Module {
    torch::nn::Linear a{nullptr}, b{nullptr}, c{nullptr};
    Square() {
      a = register_module("a", torch::nn::Linear(8, 8));
      b = register_module("b", torch::nn::Linear(8, 8));
      c = register_module("c", torch::nn::Linear(8, 8));
    }
    at::Tensor forward(at::Tensor x) { return c->forward(torch::tanh(b->forward(torch::tanh(a->forward(x))))); }
  };
  std::vector<std::vector<at::Tensor>> exact(kWorld), hooked(kWorld);
  auto errors = runRanks(kHooksBackend, kWorld, [&](int rank, ProcessGroup& pg) {
    for (bool withHook : {false, true}) {
      auto model = std::make_shared<Square>();
      ddp::test::initParameters(*model, 5);
      DdpOptions options;
      options.bucketCapBytes = 300;  // several buckets, launched during backward
      options.firstBucketCapBytes = 100;
      if (withHook) {
        PowerSgdHook::Options o;
        o.rank = 8;
        o.startSteps = 0;
        o.timeout = kTimeout;
        options.commHook = which == "powersgd" ? CommHookPtr(std::make_shared<PowerSgdHook>(o))
                                               : CommHookPtr(std::make_shared<CastHook>(at::kHalf, kTimeout));
      }
      DistributedDataParallel ddp(model, ProcessGroupPtr(&pg, [](ProcessGroup*) {}), options);
      REQUIRE(ddp.bucketCount() >= 3);
      for (int step = 0; step < kSteps; ++step) {
        for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
        const at::Tensor x = rankGradients(rank, 40, step).view({5, 8});
        model->forward(x).pow(2).sum().backward();
        ddp.finishGradientSync();
        std::vector<at::Tensor> grads;
        for (auto& p : model->parameters()) grads.push_back(p.grad().reshape({-1}).clone());
        (withHook ? hooked : exact)[rank].push_back(at::cat(grads));
      }
    }
  });
  INFO(joinErrors(errors));
  REQUIRE(joinErrors(errors).empty());
  for (int r = 0; r < kWorld; ++r) {
    for (int step = 0; step < kSteps; ++step) {
      INFO("rank " << r << ", step " << step);
      CHECK(relativeError(hooked[r][step], exact[r][step]) <= (which == "fp16" ? 2e-3 : 1e-4));
    }
  }
}

TEST_CASE("distributed.comm_hook names a hook, with its parameters, in the file or by --set", "[comm_hook][config]") {
  auto& registry = builtinPlugins();
  const std::string base = R"({
  "name": "t",
  "dataset": {"name": "wine"},
  "model": {"name": "mlp", "layers": [13, 8, 3]},
  "optimizer": {"name": "adam", "lr": 0.001},
  "loss": {"name": "cross_entropy"},
  "distributed": {DIST}
})";
  auto with = [&](const std::string& dist) { return std::regex_replace(base, std::regex("DIST"), dist); };

  ExperimentConfig none = parseExperimentConfig(with(""), "inline", ".", {}, registry);
  CHECK_FALSE(none.distributed.commHook.has_value());
  CHECK_FALSE(none.resolved["distributed"].contains("comm_hook"));

  ExperimentConfig named = parseExperimentConfig(with(R"("comm_hook": "bf16")"), "inline", ".", {}, registry);
  REQUIRE(named.distributed.commHook.has_value());
  CHECK(named.distributed.commHook->name == "bf16");
  CHECK(named.resolved["distributed"]["comm_hook"]["name"] == "bf16");

  ExperimentConfig object =
      parseExperimentConfig(with(R"("comm_hook": {"name": "powersgd", "rank": 4})"), "inline", ".", {}, registry);
  CHECK(object.distributed.commHook->params.getInt("rank") == 4);
  CHECK(object.distributed.commHook->params.getInt("start_steps") == 10);  // its default, filled in
  CHECK(object.resolved["distributed"]["comm_hook"]["start_steps"] == 10);

  // --set switches the file's hook: its parameters go unless the new one declares them.
  ExperimentConfig switched = parseExperimentConfig(with(R"("comm_hook": {"name": "powersgd", "rank": 4})"), "inline",
                                                    ".", {"distributed.comm_hook=bf16"}, registry);
  CHECK(switched.distributed.commHook->name == "bf16");
  // The default hook is allowed under any strategy.
  CHECK_NOTHROW(parseExperimentConfig(with(R"("comm_hook": "allreduce", "strategy": "zero2")"), "inline", ".", {},
                                      registry));

  ExperimentConfig set = parseExperimentConfig(
      with(""), "inline", ".", {"distributed.comm_hook=powersgd", "distributed.comm_hook.rank=2"}, registry);
  CHECK(set.distributed.commHook->name == "powersgd");
  CHECK(set.distributed.commHook->params.getInt("rank") == 2);

  CHECK_THROWS_WITH(parseExperimentConfig(with(R"("comm_hook": "bf61")"), "inline", ".", {}, registry),
                    Contains("distributed.comm_hook.name") && Contains("unknown comm_hook \"bf61\"") &&
                        Contains("did you mean \"bf16\"?"));
  CHECK_THROWS_WITH(
      parseExperimentConfig(with(R"("comm_hook": {"name": "powersgd", "rank": 0})"), "inline", ".", {}, registry),
      Contains("distributed.comm_hook.rank"));
  CHECK_THROWS_WITH(
      parseExperimentConfig(with(R"("comm_hook": "fp16", "strategy": "zero2")"), "inline", ".", {}, registry),
      Contains("distributed.comm_hook") && Contains("applies to distributed.strategy \"ddp\" only") &&
          Contains("HINT:"));
}

TEST_CASE("the wine and digits experiments with each hook reach the exact run's accuracy within 1 point",
          "[comm_hook][launcher][solo]") {
  const std::string dir = ddp::test::tempDir();
  struct Experiment {
    const char* file;
    const char* overrides;
  };
  // digits, shortened to 10 epochs to keep the test fast.
  const Experiment experiments[] = {{"wine_ddp.json", ""},
                                    {"digits_cnn.json", "--set training.epochs=10 --set training.save_every=0"}};
  for (const Experiment& e : experiments) {
    std::map<std::string, double> accuracy;
    for (const char* hook : {"allreduce", "fp16", "bf16", "powersgd"}) {
      const std::string out = fmt::format("{}/{}_{}", dir, e.file, hook);
      const auto o = ddp::test::runDdpRun(fmt::format("{}/experiments/{} --nproc-per-node 2 --out {} {} --set "
                                                      "distributed.comm_hook={}",
                                                      DDP_SOURCE_DIR, e.file, out, e.overrides, hook));
      INFO(e.file << " with " << hook << ": " << o.output);
      REQUIRE(o.exitCode == 0);
      std::ifstream metrics(out + "/metrics.jsonl");
      std::string line, last;
      while (std::getline(metrics, line)) {
        if (!line.empty()) last = line;
      }
      accuracy[hook] = nlohmann::json::parse(last)["test_accuracy"].get<double>();
    }
    for (const auto& [hook, value] : accuracy) {
      INFO(e.file << ": " << hook << " " << value << " against " << accuracy["allreduce"]);
      CHECK(value >= accuracy["allreduce"] - 0.01);
    }
  }
}
