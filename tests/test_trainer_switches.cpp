// The trainer's switches (issue 29): gradient clipping under every strategy
// against LibTorch's clip_grad_norm_ on one process, learning-rate warm-up
// against PyTorch's LinearLR, early stopping, the best checkpoints, bf16
// autocast, and the experiment's checks of them.
#include <ATen/CPUGeneratorImpl.h>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "framework/experiment/callbacks/monitor.hpp"
#include "framework/experiment/experiment_config.hpp"
#include "framework/experiment/precision.hpp"
#include "framework/experiment/run_folder.hpp"
#include "framework/experiment/trained_model.hpp"
#include "framework/experiment/trainer.hpp"
#include "framework/parallel/local_strategy.hpp"
#include "framework/parallel/sharding_units.hpp"
#include "framework/parallel/strategy.hpp"
#include "tests/test_support.hpp"

using namespace ddp;
using ddp::test::borrow;
using ddp::test::joinErrors;
using ddp::test::metricsEpochs;
using ddp::test::readFile;
using ddp::test::runRanks;
using ddp::test::tempDir;
using ddp::test::wine;

namespace {

// 10 -> 7 -> 3 (101 trainable elements: no world size from 2 to 3 divides
// them); fc1 and fc2 are fsdp units.
struct ClipNet : torch::nn::Module, ShardingUnits {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  ClipNet() {
    fc1 = register_module("fc1", torch::nn::Linear(10, 7));
    fc2 = register_module("fc2", torch::nn::Linear(7, 3));
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = runUnit(0, [&] { return fc1->forward(x); });
    return runUnit(1, [&] { return fc2->forward(torch::relu(h)); });
  }
  std::vector<std::shared_ptr<torch::nn::Module>> shardingUnits() override { return {fc1.ptr(), fc2.ptr()}; }
};

constexpr int64_t kRankBatch = 4;
constexpr int kSteps = 3;
constexpr double kMaxNorm = 0.2;

struct ClipData {
  at::Tensor x, y;
};

ClipData clipData(int world) {
  auto gen = at::detail::createCPUGenerator(11);
  const int64_t n = kSteps * world * kRankBatch;
  // Large inputs: gradient norms well above kMaxNorm, so every step clips.
  return {at::randn({n, 10}, gen) * 4, at::randint(3, {n}, gen, at::kLong)};
}

at::Tensor flatParameters(torch::nn::Module& m) {
  std::vector<at::Tensor> pieces;
  for (auto& p : m.parameters()) pieces.push_back(p.detach().reshape({-1}).clone());
  return at::cat(pieces);
}

// One process: the global batch of each step, LibTorch's clip_grad_norm_
// (the C++ twin of torch.nn.utils.clip_grad_norm_), SGD with momentum.
std::pair<at::Tensor, std::vector<double>> clipReference(int world) {
  const ClipData data = clipData(world);
  auto net = std::make_shared<ClipNet>();
  ddp::test::initParameters(*net, 42);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  std::vector<double> norms;
  for (int k = 0; k < kSteps; ++k) {
    const int64_t b = k * world * kRankBatch, e = b + world * kRankBatch;
    sgd.zero_grad();
    torch::nn::functional::cross_entropy(net->forward(data.x.slice(0, b, e)), data.y.slice(0, b, e)).backward();
    norms.push_back(torch::nn::utils::clip_grad_norm_(net->parameters(), kMaxNorm));
    sgd.step();
  }
  return {flatParameters(*net), norms};
}

// `strategy` on `world` threads: rank r takes its slice of each global batch.
std::pair<std::vector<at::Tensor>, std::vector<std::vector<double>>> clipRun(const std::string& strategy, int world) {
  const ClipData data = clipData(world);
  std::vector<at::Tensor> params(world);
  std::vector<std::vector<double>> norms(world);
  auto errors = runRanks("gloo", world, [&](int rank, ProcessGroup& pg) {
    auto net = std::make_shared<ClipNet>();
    ddp::test::initParameters(*net, 42);
    StrategyContext c;
    c.model = net;
    c.optimizer = std::make_unique<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    c.group = borrow(pg);
    c.ddp.bucketCapBytes = 64;  // several buckets (zero2's shards of each)
    auto s = builtinStrategies().create(strategy, std::move(c));
    s->setGradientClipping(kMaxNorm);
    for (int k = 0; k < kSteps; ++k) {
      const int64_t b = (int64_t(k) * world + rank) * kRankBatch;
      at::Tensor out = net->forward(data.x.slice(0, b, b + kRankBatch));
      s->backward(torch::nn::functional::cross_entropy(out, data.y.slice(0, b, b + kRankBatch)), true);
      s->step();
      norms[rank].push_back(s->lastGradNorm().value_or(-1));
    }
    s->withFullParameters([&] { params[rank] = flatParameters(*net); });
  });
  INFO(joinErrors(errors));
  REQUIRE(joinErrors(errors).empty());
  return {params, norms};
}

std::vector<nlohmann::json> stepRecords(const std::string& runDir) { return ddp::test::jsonLines(runDir + "/steps.jsonl"); }
std::vector<nlohmann::json> metricRecords(const std::string& runDir) {
  return ddp::test::jsonLines(runDir + "/metrics.jsonl");
}

TrainResult train(const ExperimentConfig& config, const std::string& runDir) {
  auto ctx = ddp::test::singleProcessContext();
  RunOptions options;
  options.runDir = runDir;
  options.quiet = true;
  options.progress = false;
  return runTraining(config, ctx, options, builtinPlugins());
}

std::string configError(const std::vector<std::string>& overrides) {
  try {
    wine(overrides);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("clip_grad_norm: every strategy clips the global norm as clip_grad_norm_ does on one process",
          "[switches][clip]") {
  const std::string strategy = GENERATE("ddp", "zero1", "zero2", "fsdp");
  const int world = GENERATE(1, 2, 3);
  INFO(strategy << ", world " << world);
  const auto [reference, referenceNorms] = clipReference(world);
  for (double norm : referenceNorms) REQUIRE(norm > kMaxNorm * 2);  // every step clips
  const auto [params, norms] = clipRun(strategy, world);
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r);
    for (int k = 0; k < kSteps; ++k) {
      INFO("step " << k);
      CHECK(norms[r][k] == Approx(referenceNorms[k]).epsilon(1e-6));
    }
    const double rel = ((params[r] - reference).abs().max() / reference.abs().max()).item<double>();
    CHECK(rel <= 1e-6);
  }
}

TEST_CASE("clip_grad_norm: off means no norm and no clipping", "[switches][clip]") {
  auto net = std::make_shared<ClipNet>();
  StrategyContext c;
  c.model = net;
  c.optimizer = std::make_unique<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.1));
  auto ctx = ddp::test::singleProcessContext();
  c.group = ctx.group;
  auto s = builtinStrategies().create("ddp", std::move(c));
  const ClipData data = clipData(1);
  s->backward(torch::nn::functional::cross_entropy(net->forward(data.x.slice(0, 0, 4)), data.y.slice(0, 0, 4)), true);
  s->step();
  CHECK_FALSE(s->lastGradNorm().has_value());
}

TEST_CASE("steps.jsonl records the norm before clipping as grad_norm", "[switches][clip]") {
  const std::string clipped = tempDir(), plain = tempDir();
  train(wine({"training.epochs=2", "training.log_every=1", "training.clip_grad_norm=0.05", "training.save_every=0"}),
        clipped);
  const auto unclippedRun =
      train(wine({"training.epochs=2", "training.log_every=1", "training.save_every=0"}), plain);
  const auto records = stepRecords(clipped);
  REQUIRE(records.size() == 10);  // 142 training rows, batch 32: 5 steps an epoch
  for (const auto& r : records) {
    REQUIRE(r.contains("grad_norm"));
    CHECK(r["grad_norm"].get<double>() > 0.05);  // the clip is active throughout
  }
  for (const auto& r : stepRecords(plain)) CHECK_FALSE(r.contains("grad_norm"));
  // Clipping changes the training: the clipped run moved less far.
  const auto clippedRun =
      train(wine({"training.epochs=2", "training.clip_grad_norm=0.05", "training.save_every=0"}), tempDir());
  CHECK(ddp::test::maxDifference(clippedRun.finalParameters, unclippedRun.finalParameters) > 1e-4);
}

TEST_CASE("scheduler.warmup_steps ramps the lr as PyTorch's LinearLR, then follows the schedule",
          "[switches][warmup][solo]") {
  const std::string dir = tempDir();
  train(wine({"training.epochs=3", "training.log_every=1", "training.save_every=0", "scheduler.name=constant",
              "scheduler.warmup_steps=7"}),
        dir);
  const auto records = stepRecords(dir);
  REQUIRE(records.size() == 15);
  // PyTorch, stepped once per optimizer step: LinearLR(start_factor=1/7,
  // total_iters=6) is min(1, (s + 1) / 7) of the base lr.
  const std::string script = dir + "/linear_lr.py";
  std::ofstream(script) << "import torch\n"
                           "p = torch.nn.Parameter(torch.zeros(1))\n"
                           "opt = torch.optim.Adam([p], lr=0.001)\n"
                           "s = torch.optim.lr_scheduler.LinearLR(opt, start_factor=1/7, end_factor=1.0, "
                           "total_iters=6)\n"
                           "for _ in range(15):\n"
                           "    print(repr(opt.param_groups[0]['lr']))\n"
                           "    opt.step()\n"
                           "    s.step()\n";
  const std::string output = dir + "/lrs.txt";
  if (std::system(("/usr/bin/python3 " + script + " > " + output + " 2>/dev/null").c_str()) != 0) {
    WARN("SKIPPED: /usr/bin/python3 with torch is not available for the PyTorch side");
    return;
  }
  std::ifstream in(output);
  for (const auto& record : records) {
    double torchLr = 0;
    REQUIRE(in >> torchLr);
    INFO("step " << record["step"]);
    CHECK(record["lr"].get<double>() == Approx(torchLr).epsilon(1e-12));
  }
}

TEST_CASE("scheduler.warmup_steps scales every scheduler's lr, counting resumed steps", "[switches][warmup]") {
  const std::string dir = tempDir();
  train(wine({"training.epochs=3", "training.log_every=1", "training.save_every=0", "scheduler.name=cosine",
              "scheduler.t_max=3", "scheduler.warmup_steps=8"}),
        dir);
  const auto records = stepRecords(dir);
  REQUIRE(records.size() == 15);
  for (const auto& r : records) {
    const int64_t step = r["step"], epoch = r["epoch"];
    const double cosine = 0.001 * (1 + std::cos(M_PI * double(epoch - 1) / 3)) / 2;
    const double expected = cosine * std::min(1.0, double(step) / 8);  // step is 1-based: (s + 1) / 8
    INFO("step " << step);
    CHECK(r["lr"].get<double>() == Approx(expected).epsilon(1e-12));
  }
  CHECK(warmupFactor(0, 0) == 1.0);
  CHECK(warmupFactor(0, 4) == 0.25);
  CHECK(warmupFactor(3, 4) == 1.0);
  CHECK(warmupFactor(100, 4) == 1.0);
}

TEST_CASE("early_stopping ends the run after `patience` evaluations without improvement, exit 0",
          "[switches][early]") {
  const std::string dir = tempDir();
  // min_delta 100: nothing after the first evaluation counts as better.
  const auto result =
      train(wine({"training.epochs=20", "training.eval_every=1", "training.save_every=5",
                  "training.early_stopping.patience=2", "training.early_stopping.min_delta=100"}),
            dir);
  CHECK(result.history.size() == 3);
  CHECK(metricsEpochs(dir) == std::vector<int64_t>{1, 2, 3});
  CHECK(result.stopReason.find("early stopping after epoch 3: test_loss has not improved") != std::string::npos);
  CHECK(readFile(dir + "/train.log").find("early stopping after epoch 3") != std::string::npos);
  // The stopping epoch is the run's last: its checkpoint is written.
  CHECK(newestCheckpoint(dir) == dir + "/checkpoints/epoch_000003.pt");

  // Without min_delta an improving loss keeps training to the end.
  const auto improving = train(wine({"training.epochs=6", "training.eval_every=1", "training.save_every=0",
                                     "training.early_stopping.patience=2"}),
                               tempDir());
  CHECK(improving.history.size() == 6);
  CHECK(improving.stopReason.empty());
}

TEST_CASE("early stopping on two ranks: one decision, every rank stops after the same epoch, exit code 0",
          "[switches][early][launcher]") {
  const std::string dir = tempDir() + "/run";
  const auto outcome = ddp::test::runDdpRun(
      "--nproc-per-node 2 " + std::string(DDP_SOURCE_DIR) +
      "/experiments/wine_baseline.json --out " + dir +
      " --set training.epochs=30 --set training.eval_every=2 --set training.save_every=0"
      " --set training.early_stopping.monitor=test_accuracy --set training.early_stopping.patience=2"
      " --set training.early_stopping.min_delta=2");
  INFO(outcome.output);
  CHECK(outcome.exitCode == 0);
  // Evaluations at epochs 2, 4, 6: the first is the best, two more do not improve.
  CHECK(metricsEpochs(dir) == std::vector<int64_t>{1, 2, 3, 4, 5, 6});
  CHECK(readFile(dir + "/train.log").find("early stopping after epoch 6: test_accuracy") != std::string::npos);
}

TEST_CASE("keep_best keeps the K best checkpoints by the metric, and the trained-model loader takes best",
          "[switches][best]") {
  const std::string dir = tempDir();
  train(wine({"training.epochs=8", "training.eval_every=1", "training.save_every=4", "training.keep_best=2",
              "training.keep_best_by=train_loss", "model.dropout=0.2"}),
        dir);
  // The two lowest train losses of the run, best first, ties to the older.
  std::vector<std::pair<double, int64_t>> byLoss;
  for (const auto& r : metricRecords(dir)) byLoss.emplace_back(r["train_loss"].get<double>(), r["epoch"].get<int64_t>());
  std::sort(byLoss.begin(), byLoss.end());
  const auto index = nlohmann::json::parse(readFile(dir + "/checkpoints/best/index.json"));
  CHECK(index["monitor"] == "train_loss");
  CHECK(index["mode"] == "min");
  REQUIRE(index["best"].size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    CHECK(index["best"][i]["epoch"].get<int64_t>() == byLoss[i].second);
    CHECK(index["best"][i]["value"].get<double>() == Approx(byLoss[i].first).epsilon(1e-7));  // metrics.jsonl: 8 digits
  }
  // Only those two files; the periodic checkpoints beside them.
  const auto kept = listBestCheckpoints(dir);
  REQUIRE(kept.size() == 2);
  CHECK(std::min(kept[0].epoch, kept[1].epoch) == std::min(byLoss[0].second, byLoss[1].second));
  CHECK(newestCheckpoint(dir) == dir + "/checkpoints/epoch_000008.pt");
  const std::string best = bestCheckpoint(dir);
  CHECK(best == dir + "/checkpoints/" + index["best"][0]["file"].get<std::string>());

  // The loader reads that file's weights, not the latest's.
  const TrainedModel fromBest = loadTrainedModel(dir, builtinPlugins(), "best");
  CHECK(fromBest.checkpoint == best);
  const TrainedModel fromFile = loadTrainedModel(dir, builtinPlugins(), best);
  const auto a = fromBest.model->parameters(), b = fromFile.model->parameters();
  CHECK(ddp::test::maxDifference(a, b) == 0.0);
  const TrainedModel latest = loadTrainedModel(dir, builtinPlugins(), "latest");
  CHECK(latest.checkpoint == newestCheckpoint(dir));
  if (index["best"][0]["epoch"] != 8) CHECK(ddp::test::maxDifference(a, latest.model->parameters()) > 0);
  CHECK_THROWS_WITH(loadTrainedModel(tempDir(), builtinPlugins(), "best"), Catch::Contains("config.json"));
}

TEST_CASE("keep_best with test_accuracy keeps the highest, by early_stopping's monitor by default",
          "[switches][best]") {
  const std::string dir = tempDir();
  train(wine({"training.epochs=6", "training.eval_every=1", "training.save_every=0", "training.keep_best=3",
              "training.early_stopping.monitor=test_accuracy", "training.early_stopping.patience=50"}),
        dir);
  const auto index = nlohmann::json::parse(readFile(dir + "/checkpoints/best/index.json"));
  CHECK(index["monitor"] == "test_accuracy");
  CHECK(index["mode"] == "max");
  REQUIRE(index["best"].size() == 3);
  CHECK(index["best"][0]["value"].get<double>() >= index["best"][1]["value"].get<double>());
  CHECK(index["best"][1]["value"].get<double>() >= index["best"][2]["value"].get<double>());
  double highest = 0;
  for (const auto& r : metricRecords(dir)) highest = std::max(highest, r["test_accuracy"].get<double>());
  CHECK(index["best"][0]["value"].get<double>() == Approx(highest).epsilon(1e-7));
  CHECK(listBestCheckpoints(dir).size() == 3);
}

TEST_CASE("precision bf16 computes the forward in bfloat16, keeping fp32 weights, close to fp32",
          "[switches][bf16]") {
  {
    // The scope: matmul in bf16 inside, fp32 outside and after.
    const at::Tensor a = at::randn({4, 4}), b = at::randn({4, 4});
    {
      const ComputePrecision bf16(Precision::Bf16, c10::DeviceType::CPU);
      CHECK(at::matmul(a, b).scalar_type() == at::kBFloat16);
      CHECK(lossInput(at::matmul(a, b)).scalar_type() == at::kFloat);
    }
    CHECK(at::matmul(a, b).scalar_type() == at::kFloat);
    const ComputePrecision fp32(Precision::Fp32, c10::DeviceType::CPU);
    CHECK(at::matmul(a, b).scalar_type() == at::kFloat);
  }
  const std::string model = GENERATE("mlp", "cnn");
  INFO(model);
  const std::vector<std::string> base =
      model == "mlp" ? std::vector<std::string>{"training.epochs=5", "training.eval_every=1", "training.save_every=0"}
                     : std::vector<std::string>{"training.epochs=2",       "training.eval_every=1",
                                                "training.save_every=0",   "training.threads=2",
                                                "distributed.nproc_per_node=1"};
  auto make = [&](const std::string& precision) {
    std::vector<std::string> o = base;
    o.push_back("training.precision=" + precision);
    if (model == "mlp") return wine(o);
    return loadExperimentConfig(std::string(DDP_SOURCE_DIR) + "/experiments/digits_cnn.json", o, builtinPlugins());
  };
  const auto fp32 = train(make("fp32"), tempDir());
  const auto bf16 = train(make("bf16"), tempDir());
  for (const auto& p : bf16.finalParameters) CHECK(p.scalar_type() == at::kFloat);
  // Not the fp32 run (autocast was on), but close to it.
  CHECK(ddp::test::maxDifference(bf16.finalParameters, fp32.finalParameters) > 0);
  const double a = *fp32.history.back().testLoss, b = *bf16.history.back().testLoss;
  CHECK(std::abs(b - a) / a < 0.1);
}

TEST_CASE("the switches' mistakes are one line naming the key", "[switches][config]") {
  CHECK_THAT(configError({"training.clip_grad_norm=-1"}), Catch::Contains("training.clip_grad_norm: expected"));
  CHECK_THAT(configError({"training.precision=fp16"}), Catch::Contains("training.precision: expected"));
  CHECK_THAT(configError({"training.keep_best=-2"}), Catch::Contains("training.keep_best: expected"));
  CHECK_THAT(configError({"training.keep_best_by=test_accurcy"}),
             Catch::Contains("training.keep_best_by: expected one of") && Catch::Contains("did you mean"));
  CHECK_THAT(configError({"training.early_stopping.patience=0"}),
             Catch::Contains("training.early_stopping.patience: expected"));
  CHECK_THAT(configError({"training.early_stopping.monitor=loss"}),
             Catch::Contains("training.early_stopping.monitor: expected"));
  CHECK_THAT(configError({"training.early_stopping.paitence=2"}),
             Catch::Contains("training.early_stopping.paitence") && Catch::Contains("did you mean \"patience\""));
  CHECK_THAT(configError({"training.early_stopping=5"}), Catch::Contains("training.early_stopping: expected an object"));
  CHECK_THAT(configError({"scheduler.name=step", "scheduler.warmup_steps=-1"}),
             Catch::Contains("scheduler.warmup_steps: expected"));
  // Resolved: early_stopping in full, null when off; warmup_steps under the scheduler.
  const auto on = wine({"training.early_stopping.patience=4", "scheduler.name=cosine"});
  CHECK(on.resolved["training"]["early_stopping"]["patience"] == 4);
  CHECK(on.resolved["training"]["early_stopping"]["mode"] == "auto");
  CHECK(on.resolved["scheduler"]["warmup_steps"] == 0);
  CHECK(on.training.keepBestMonitor == "test_loss");
  CHECK(wine({}).resolved["training"]["early_stopping"].is_null());
  CHECK_FALSE(wine({"training.early_stopping=null"}).training.earlyStopping.has_value());
  // A metric the dataset never records fails before the run folder exists.
  const std::string dir = tempDir() + "/never";
  CHECK_THROWS_WITH(train(wine({"training.early_stopping.monitor=test_rmse"}), dir),
                    Catch::Contains("training.early_stopping.monitor: the dataset's task (classification) records no "
                                    "test_rmse"));
  CHECK_FALSE(std::filesystem::exists(dir));
  CHECK_THROWS_WITH(train(wine({"training.keep_best=1", "training.keep_best_by=test_perplexity"}), dir),
                    Catch::Contains("training.keep_best_by"));
}

TEST_CASE("the switches are in --describe and --schema", "[switches][config]") {
  PluginRegistry& registry = builtinPlugins();
  const std::string training = *describeSection("training", registry);
  for (const char* key : {"clip_grad_norm", "precision", "keep_best", "keep_best_by", "early_stopping"}) {
    CHECK_THAT(training, Catch::Contains(key));
  }
  CHECK_THAT(*describeSection("training.early_stopping", registry),
             Catch::Contains("patience") && Catch::Contains("min_delta"));
  CHECK_THAT(registry.describe("scheduler.cosine"), Catch::Contains("warmup_steps"));
  CHECK_THAT(registry.describe("scheduler.constant"), Catch::Contains("warmup_steps"));
  const Json schema = experimentSchema(registry);
  const Json& props = schema["properties"]["training"]["properties"];
  CHECK(props["precision"]["enum"] == Json::array({"fp32", "bf16"}));
  CHECK(props["early_stopping"]["oneOf"][1]["properties"]["patience"]["minimum"] == 1);
  CHECK(props["keep_best_by"]["enum"].size() == monitorNames().size() + 1);
}

TEST_CASE("every switch at once under zero1, zero2 and fsdp on two processes", "[switches][launcher][solo]") {
  const std::string strategy = GENERATE("zero1", "zero2", "fsdp");
  INFO(strategy);
  const std::string dir = tempDir() + "/run";
  const auto outcome = ddp::test::runDdpRun(
      "--nproc-per-node 2 " + std::string(DDP_SOURCE_DIR) + "/experiments/wine_baseline.json --out " + dir +
      " --set distributed.strategy=" + strategy +
      " --set training.epochs=40 --set training.eval_every=1 --set training.save_every=0 --set training.log_every=1"
      " --set training.clip_grad_norm=0.1 --set training.precision=bf16 --set training.keep_best=2"
      " --set training.early_stopping.patience=1 --set training.early_stopping.min_delta=0.05"
      " --set scheduler.name=step --set scheduler.warmup_steps=6");
  INFO(outcome.output);
  REQUIRE(outcome.exitCode == 0);
  const auto epochs = metricsEpochs(dir);
  REQUIRE(!epochs.empty());
  CHECK(epochs.size() < 40);  // stopped early
  CHECK(readFile(dir + "/train.log").find("early stopping after epoch " + std::to_string(epochs.back())) !=
        std::string::npos);
  const auto index = nlohmann::json::parse(readFile(dir + "/checkpoints/best/index.json"));
  CHECK(index["best"].size() == std::min<size_t>(2, epochs.size()));
  CHECK(listBestCheckpoints(dir).size() == index["best"].size());
  // The consolidated best checkpoint loads into the plain model.
  CHECK(loadTrainedModel(dir, builtinPlugins(), "best").checkpoint == bestCheckpoint(dir));
  const auto steps = stepRecords(dir);
  REQUIRE(steps.size() >= 6);
  for (size_t i = 0; i < steps.size(); ++i) {
    CHECK(steps[i]["grad_norm"].get<double>() > 0);
    if (i < 6) CHECK(steps[i]["lr"].get<double>() == Approx(0.001 * double(i + 1) / 6).epsilon(1e-12));
  }
}

TEST_CASE("a resumed run with early stopping stops where the uninterrupted one does", "[switches][early][checkpoint]") {
  const std::vector<std::string> base = {"training.eval_every=1", "training.save_every=2",
                                         "training.early_stopping.patience=2",
                                         "training.early_stopping.min_delta=100"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), base.begin(), base.end());
    return wine(more);
  };
  const auto whole = train(with({"training.epochs=20"}), tempDir());
  REQUIRE(whole.history.size() == 3);
  const std::string dir = tempDir();
  train(with({"training.epochs=2"}), dir);  // epoch 1 the best, epoch 2 one without improvement
  auto ctx = ddp::test::singleProcessContext();
  RunOptions options;
  options.runDir = dir;
  options.quiet = true;
  options.resume = true;
  const auto resumed = runTraining(with({"training.epochs=20"}), ctx, options, builtinPlugins());
  CHECK(resumed.history.size() == 1);  // epoch 3, as the uninterrupted run
  CHECK(metricsEpochs(dir) == std::vector<int64_t>{1, 2, 3});
  CHECK(resumed.stopReason.find("early stopping after epoch 3") != std::string::npos);
}

TEST_CASE("keep_best: a restart from scratch drops the earlier attempt's best checkpoints", "[switches][best]") {
  const std::string dir = tempDir();
  train(wine({"training.epochs=3", "training.eval_every=1", "training.save_every=0", "training.keep_best=1"}), dir);
  REQUIRE(listBestCheckpoints(dir).size() == 1);
  const std::string stale = listBestCheckpoints(dir).front().path;
  // A launcher's restart with no periodic checkpoint starts over; the new
  // attempt's single epoch is the only best one.
  auto ctx = ddp::test::singleProcessContext();
  RunOptions options;
  options.runDir = dir;
  options.quiet = true;
  options.resume = true;
  options.restart = true;
  runTraining(wine({"training.epochs=1", "training.eval_every=1", "training.save_every=0", "training.keep_best=1"}),
              ctx, options, builtinPlugins());
  const auto kept = listBestCheckpoints(dir);
  REQUIRE(kept.size() == 1);
  CHECK(kept.front().epoch == 1);
  CHECK(bestCheckpoint(dir) == dir + "/checkpoints/best/epoch_000001.pt");
  if (stale != kept.front().path) CHECK_FALSE(std::filesystem::exists(stale));
  // An index entry that leaves checkpoints/ is refused, not followed.
  std::ofstream(dir + "/checkpoints/best/index.json") << R"({"best": [{"epoch": 1, "file": "../../../etc/passwd"}]})";
  CHECK_THROWS_WITH(bestCheckpoint(dir), Catch::Contains("leaves the run's checkpoints/ folder"));
}

TEST_CASE("a strategy that does not clip refuses clip_grad_norm, and early stopping needs evaluations",
          "[switches][clip][config]") {
  struct NoClip : LocalStrategy {
    using LocalStrategy::LocalStrategy;
    bool supportsGradientClipping() const override { return false; }
  };
  auto net = std::make_shared<ClipNet>();
  NoClip strategy(net, std::make_unique<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.1)));
  CHECK_NOTHROW(strategy.setGradientClipping(0));
  CHECK_THROWS_WITH(strategy.setGradientClipping(1.0), Catch::Contains("does not clip gradients"));
  CHECK_THAT(configError({"training.eval_every=0", "training.early_stopping.patience=2"}),
             Catch::Contains("training.early_stopping: needs evaluations"));
}
