// Resume that continues the right run or refuses: changed settings
// (resume_rules.hpp), checkpoints that cannot be read, the order of
// checkpoints, the run folder's lock, a folder without checkpoints, and a
// checkpoint written on SIGTERM (training.checkpoint_on_signal).
#include <signal.h>

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "plugins/builtin.hpp"
#include "framework/experiment/experiment_config.hpp"
#include "framework/experiment/resume_rules.hpp"
#include "framework/experiment/run_folder.hpp"
#include "framework/experiment/trainer.hpp"
#include "framework/parallel/strategy.hpp"
#include "tests/test_support.hpp"

using namespace ddp;
using ddp::test::runDdpRun;
using ddp::test::maxDifference;
using ddp::test::wine;
using ddp::test::metricsEpochs;
using ddp::test::readFile;
using ddp::test::TempDir;

namespace {






// Raises `signal` in this process after the optimizer step `atStep`.
class RaiseAtStep : public TrainerCallback {
 public:
  RaiseAtStep(int64_t atStep, int signal) : atStep_(atStep), signal_(signal) {}
  bool wantsSteps() const override { return true; }
  void onStepEnd(Trainer&, const StepEnd& step) override {
    if (step.stepped && step.steps == atStep_) ::raise(signal_);
  }

 private:
  int64_t atStep_;
  int signal_;
};

// Wine for 6 epochs (checkpoints every 2) in `whole`, and the same run
// stopped after 4 epochs in `parts`; `ro` is left pointing at `parts`.
TrainResult uninterruptedAndFirstPart(const std::vector<std::string>& base, const TempDir& whole,
                                      const TempDir& parts, const ddp::DistributedContext& ctx, RunOptions& ro) {
  ro.quiet = true;
  ro.runDir = whole.path();
  TrainResult uninterrupted = runTraining(wine(base), ctx, ro, builtinPlugins());
  ro.runDir = parts.path();
  auto firstPart = base;
  firstPart.push_back("training.epochs=4");
  runTraining(wine(firstPart), ctx, ro, builtinPlugins());
  return uninterrupted;
}

}  // namespace

TEST_CASE("resume rules: only the settings listed as safe may change", "[resume]") {
  Json saved = wine({}).resolved;
  SECTION("nothing changed") { CHECK(compareForResume(saved, saved).empty()); }
  SECTION("epochs and lr may change; the model may not") {
    Json now = wine({"training.epochs=200", "optimizer.lr=0.01", "model.layers=[13,32,3]"}).resolved;
    const auto changes = compareForResume(saved, now);
    REQUIRE(changes.size() == 3);
    CHECK(changes[0].key == "model.layers");
    CHECK_FALSE(changes[0].allowed);
    CHECK(changes[0].before == "[13,64,3]");
    CHECK(changes[0].after == "[13,32,3]");
    CHECK(changes[1].key == "optimizer.lr");
    CHECK(changes[1].allowed);
    CHECK(changes[2].key == "training.epochs");
    CHECK(changes[2].allowed);
  }
  SECTION("every training and distributed setting has a rule of its own, not the refusal of unlisted keys") {
    // A key added to the config without a resume rule fails here, so that
    // whoever adds it decides whether a resumed run may change it.
    for (const char* section : {"training", "distributed"}) {
      for (auto it = saved[section].begin(); it != saved[section].end(); ++it) {
        Json changed = saved;
        changed[section][it.key()] = Json("another value");
        const auto changes = compareForResume(saved, changed);
        REQUIRE(changes.size() == 1);
        INFO(changes[0].key << ": " << changes[0].reason);
        CHECK(changes[0].reason != "not known to be safe to change on resume");
      }
    }
  }
  SECTION("another optimizer: its name is the one change reported") {
    const auto changes = compareForResume(saved, wine({"optimizer.name=sgd"}).resolved);
    REQUIRE(changes.size() == 1);
    CHECK(changes[0].key == "optimizer.name");
    CHECK_FALSE(changes[0].allowed);
  }
  SECTION("a key the table does not list is refused") {
    Json now = saved;
    now["training"]["some_new_setting"] = 3;
    const auto changes = compareForResume(saved, now);
    REQUIRE(changes.size() == 1);
    CHECK(changes[0].before == "(absent)");
    CHECK_FALSE(changes[0].allowed);
    CHECK(changes[0].reason == "not known to be safe to change on resume");
  }
  SECTION("the seed draws the split: refused") {
    const auto changes = compareForResume(saved, wine({"training.seed=7"}).resolved);
    REQUIRE(changes.size() == 1);
    CHECK_FALSE(changes[0].allowed);
  }
}

TEST_CASE("resume with a changed model or optimizer is refused and the run folder kept", "[resume][solo]") {
  TempDir tmp;
  const std::string exp = std::string(DDP_SOURCE_DIR) + "/experiments/wine_baseline.json";
  const std::string runDir = tmp.path() + "/run";
  REQUIRE(runDdpRun(exp + " --set training.epochs=2 --set training.save_every=1 --out " + runDir).exitCode == 0);
  const std::string config = readFile(runDir + "/config.json"), metrics = readFile(runDir + "/metrics.jsonl");
  REQUIRE(!config.empty());

  ddp::test::ProgramOutcome narrower =
      runDdpRun(exp + " --set training.epochs=3 --set model.layers=[13,32,3] --resume --out " + runDir);
  INFO(narrower.output);
  CHECK(narrower.exitCode == 2);
  CHECK(narrower.output.find("model.layers [13,64,3] -> [13,32,3]") != std::string::npos);
  CHECK(narrower.output.find("HINT: start a new run with another --out") != std::string::npos);
  CHECK(narrower.output.find("training.epochs") == std::string::npos);  // allowed: not among the refused
  CHECK(std::count(narrower.output.begin(), narrower.output.end(), '\n') == 1);

  ddp::test::ProgramOutcome sgd = runDdpRun(exp + " --set optimizer.name=sgd --resume --out " + runDir);
  INFO(sgd.output);
  CHECK(sgd.exitCode == 2);
  CHECK(sgd.output.find("optimizer.name \"adam\" -> \"sgd\"") != std::string::npos);
  CHECK(std::count(sgd.output.begin(), sgd.output.end(), '\n') == 1);

  CHECK(readFile(runDir + "/config.json") == config);
  CHECK(readFile(runDir + "/metrics.jsonl") == metrics);
}

TEST_CASE("resume with more epochs and another lr is allowed, logged and applied", "[resume]") {
  TempDir whole, parts;
  const std::vector<std::string> base = {"training.epochs=6", "training.save_every=2", "model.dropout=0.1"};
  auto ctx = ddp::test::singleProcessContext();
  RunOptions ro;
  const auto uninterrupted = uninterruptedAndFirstPart(base, whole, parts, ctx, ro);
  ro.resume = true;
  const auto resumed = runTraining(wine(base), ctx, ro, builtinPlugins());
  CHECK(maxDifference(resumed.finalParameters, uninterrupted.finalParameters) == 0.0);
  const std::string log = readFile(parts.path() + "/train.log");
  CHECK(log.find("resume: training.epochs 4 -> 6\n") != std::string::npos);
  CHECK(Json::parse(readFile(parts.path() + "/config.json"))["training"]["epochs"] == 6);

  // The new lr is the optimizer's after the checkpoint is loaded.
  auto faster = base;
  faster.push_back("training.epochs=8");
  faster.push_back("optimizer.lr=0.005");
  const ExperimentConfig config = wine(faster);
  Trainer trainer(config, ctx, ro, builtinPlugins());
  trainer.build();
  CHECK(trainer.startEpoch() == 6);
  CHECK(trainer.strategy().optimizer().param_groups()[0].options().get_lr() == Approx(0.005));
  CHECK(readFile(parts.path() + "/train.log").find("resume: optimizer.lr 0.001 -> 0.005") != std::string::npos);
}

TEST_CASE("resume falls back to the newest checkpoint that can be read", "[resume]") {
  TempDir whole, parts;
  const std::vector<std::string> base = {"training.epochs=6", "training.save_every=2", "model.dropout=0.1"};
  auto ctx = ddp::test::singleProcessContext();
  RunOptions ro;
  const auto uninterrupted = uninterruptedAndFirstPart(base, whole, parts, ctx, ro);
  const std::string newest = parts.path() + "/checkpoints/epoch_000004.pt";
  const std::string older = parts.path() + "/checkpoints/epoch_000002.pt";
  std::filesystem::resize_file(newest, std::filesystem::file_size(newest) / 2);

  ro.resume = true;
  const auto resumed = runTraining(wine(base), ctx, ro, builtinPlugins());
  CHECK(resumed.history.size() == 4);
  CHECK(maxDifference(resumed.finalParameters, uninterrupted.finalParameters) == 0.0);
  CHECK(metricsEpochs(parts.path()) == std::vector<int64_t>{1, 2, 3, 4, 5, 6});
  const std::string log = readFile(parts.path() + "/train.log");
  CHECK(log.find("checkpoint " + newest + " cannot be read (") != std::string::npos);
  CHECK(log.find("; resuming from " + older + "\n") != std::string::npos);

  // None can be read: one line, and the folder as it was.
  for (const auto& file : listCheckpoints(parts.path())) std::ofstream(file.path, std::ios::trunc) << "garbage";
  const std::string metrics = readFile(parts.path() + "/metrics.jsonl"), config = readFile(parts.path() + "/config.json");
  auto more = base;
  more.push_back("training.epochs=9");
  try {
    runTraining(wine(more), ctx, ro, builtinPlugins());
    FAIL("resumed from unreadable checkpoints");
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    CHECK(what.find("--resume: no checkpoint in " + parts.path() + "/checkpoints can be read; the newest: checkpoint " +
                    parts.path() + "/checkpoints/epoch_000006.pt cannot be read (") == 0);
    CHECK(what.find('\n') == std::string::npos);
  }
  CHECK(readFile(parts.path() + "/metrics.jsonl") == metrics);
  CHECK(readFile(parts.path() + "/config.json") == config);
}

TEST_CASE("the newest checkpoint is chosen by epoch number, not by name", "[resume]") {
  TempDir tmp;
  std::filesystem::create_directories(tmp.path() + "/checkpoints");
  for (const char* name : {"epoch_999999.pt", "epoch_1000000.pt", "epoch_000003_batch_000002.pt", "epoch_000003.pt",
                           "epoch_1000001.pt.tmp", "epoch_x.pt", "notes.txt"}) {
    std::ofstream(tmp.path() + "/checkpoints/" + name) << "x";
  }
  CHECK(newestCheckpoint(tmp.path()) == tmp.path() + "/checkpoints/epoch_1000000.pt");
  std::vector<std::string> order;
  for (const auto& file : listCheckpoints(tmp.path())) order.push_back(file.path.substr(file.path.rfind('/') + 1));
  // epoch_000003_batch_000002: 2 batches into epoch 3, after epoch_000002.pt and before epoch_000003.pt.
  CHECK(order == std::vector<std::string>{"epoch_1000000.pt", "epoch_999999.pt", "epoch_000003.pt",
                                          "epoch_000003_batch_000002.pt"});
  CHECK(checkpointFileName(1000000) == "epoch_1000000.pt");
  CHECK(checkpointFileName(2, 2) == "epoch_000003_batch_000002.pt");
  std::ofstream(tmp.path() + "/checkpoints/epoch_000000_batch_000002.pt") << "x";
  CHECK(listCheckpoints(tmp.path()).size() == 4);
}

TEST_CASE("a run folder is locked while a job owns it", "[resume]") {
  TempDir tmp;
  auto first = std::make_unique<RunFolderLock>(tmp.path());
  try {
    RunFolderLock second(tmp.path());
    FAIL("two owners of one run folder");
  } catch (const UsageError& e) {
    CHECK(std::string(e.what()) == "run folder " + tmp.path() + " is in use by pid " + std::to_string(::getpid()) +
                                       " (host " + [] {
                                         char host[256] = {};
                                         ::gethostname(host, sizeof(host) - 1);
                                         return std::string(host);
                                       }() + "). HINT: wait for that job to end, or use another --out");
  }
  first.reset();
  CHECK_NOTHROW(RunFolderLock(tmp.path()));
}

TEST_CASE("resume never destroys what it cannot continue", "[resume][solo]") {
  TempDir tmp;
  const std::string exp = std::string(DDP_SOURCE_DIR) + "/experiments/wine_baseline.json";
  const std::string runDir = tmp.path() + "/run";
  // Metrics but no checkpoint (save_every 0).
  REQUIRE(runDdpRun(exp + " --set training.epochs=2 --set training.save_every=0 --out " + runDir).exitCode == 0);
  const std::string metrics = readFile(runDir + "/metrics.jsonl");
  ddp::test::ProgramOutcome o = runDdpRun(exp + " --set training.epochs=3 --set training.save_every=0 --resume --out " + runDir);
  INFO(o.output);
  CHECK(o.exitCode == 2);
  CHECK(o.output == "--resume: " + runDir +
                        " holds metrics but no checkpoint to continue from; starting again would overwrite them. "
                        "HINT: runs to be resumed need training.save_every > 0; start this one again with another "
                        "--out\n");
  CHECK(readFile(runDir + "/metrics.jsonl") == metrics);

  // --resume without --out, as a launcher, a single process and a rank.
  for (const std::string ranks : {"", "--nproc-per-node 2 "}) {
    ddp::test::ProgramOutcome noOut = runDdpRun(ranks + exp + " --resume");
    INFO(noOut.output);
    CHECK(noOut.exitCode == 2);
    CHECK(noOut.output == "ddp-run: --resume needs the run folder to continue. HINT: --out RUN_DIR\n");
  }
  ddp::test::ProgramOutcome rank =
      runDdpRun(exp + " --resume", "RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=1");
  CHECK(rank.exitCode == 2);
  CHECK(rank.output == "ddp-run: --resume needs the run folder to continue. HINT: --out RUN_DIR\n");

  // A folder that does not exist, or holds no run.
  ddp::test::ProgramOutcome missing = runDdpRun(exp + " --resume --out " + tmp.path() + "/nothing");
  CHECK(missing.exitCode == 2);
  CHECK(missing.output == "--resume: run folder " + tmp.path() +
                              "/nothing does not exist. HINT: --out the folder of the run to continue\n");
  CHECK_FALSE(std::filesystem::exists(tmp.path() + "/nothing"));
  std::filesystem::create_directories(tmp.path() + "/empty");
  ddp::test::ProgramOutcome empty = runDdpRun(exp + " --resume --out " + tmp.path() + "/empty");
  CHECK(empty.exitCode == 2);
  CHECK(empty.output == "--resume: " + tmp.path() +
                            "/empty holds no config.json, so no run to continue. HINT: --out the folder of the run "
                            "to continue\n");
}

TEST_CASE("a checkpoint folder that cannot be written is found before training", "[resume]") {
  TempDir tmp;
  const std::string exp = std::string(DDP_SOURCE_DIR) + "/experiments/wine_baseline.json";
  // A file where the checkpoint folder would be.
  std::ofstream(tmp.path() + "/checkpoints");
  ddp::test::ProgramOutcome o = runDdpRun(exp + " --set training.epochs=2 --set training.save_every=1 --out " + tmp.path());
  INFO(o.output);
  CHECK(o.exitCode == 2);
  CHECK(o.output.find("cannot create " + tmp.path() + "/checkpoints: ") == 0);
  CHECK_FALSE(std::filesystem::exists(tmp.path() + "/metrics.jsonl"));
}

TEST_CASE("SIGTERM with checkpoint_on_signal saves the step, and resume ends like an uninterrupted run",
          "[resume][signal]") {
  TempDir whole, parts;
  const std::vector<std::string> base = {"training.epochs=4", "model.dropout=0.1", "training.eval_every=1"};
  auto ctx = ddp::test::singleProcessContext();
  RunOptions ro;
  ro.quiet = true;
  ro.runDir = whole.path();
  const auto uninterrupted = runTraining(wine(base), ctx, ro, builtinPlugins());

  auto onSignal = base;
  onSignal.push_back("training.checkpoint_on_signal=true");
  ro.runDir = parts.path();
  struct sigaction before {};
  ::sigaction(SIGTERM, nullptr, &before);
  {
    // 5 steps an epoch: step 7 is batch 2 of epoch 2.
    const ExperimentConfig config = wine(onSignal);
    Trainer trainer(config, ctx, ro, builtinPlugins());
    trainer.addCallback(std::make_shared<RaiseAtStep>(7, SIGTERM));
    trainer.addStandardCallbacks();
    const auto stopped = trainer.run();
    CHECK(stopped.signal == SIGTERM);
    CHECK(stopped.steps == 7);
    CHECK(stopped.history.size() == 1);
  }
  CHECK(newestCheckpoint(parts.path()) == parts.path() + "/checkpoints/epoch_000002_batch_000002.pt");
  CHECK(readFile(parts.path() + "/train.log").find("signal 15: saved " + parts.path() +
                                                 "/checkpoints/epoch_000002_batch_000002.pt (step 7, 2 batches "
                                                 "into epoch 2); stopping") != std::string::npos);
  ro.resume = true;
  const auto resumed = runTraining(wine(onSignal), ctx, ro, builtinPlugins());
  CHECK(resumed.signal == 0);
  CHECK(resumed.steps == uninterrupted.steps);
  CHECK(maxDifference(resumed.finalParameters, uninterrupted.finalParameters) == 0.0);
  CHECK(metricsEpochs(parts.path()) == std::vector<int64_t>{1, 2, 3, 4});
  // Epoch 2's train loss covers all its batches, before and after the stop.
  REQUIRE(resumed.history.size() == 3);
  CHECK(resumed.history[0].trainLoss == Approx(uninterrupted.history[1].trainLoss).epsilon(1e-12));
  // After the run, SIGTERM's handler is the one before it again.
  struct sigaction after {};
  ::sigaction(SIGTERM, nullptr, &after);
  CHECK(after.sa_handler == before.sa_handler);
}
