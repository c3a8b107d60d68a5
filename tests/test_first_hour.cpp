// A new user's first hour (issue 32): default run folders that never
// collide, a config.json that reproduces the run's world, refused bad
// seeds, --version, hints where users go wrong, resume that says what it
// did, and models that size themselves from the data.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "apps/sample.hpp"
#include "tests/test_support.hpp"

using namespace ddp;
using ddp::test::readFile;
using ddp::test::runDdpRun;
using ddp::test::tempDir;
using Catch::Contains;
using ddp::test::ddpRunPath;

namespace {

const std::string kWine = std::string(DDP_SOURCE_DIR) + "/experiments/wine_baseline.json";

nlohmann::json configOf(const std::string& runDir) { return nlohmann::json::parse(readFile(runDir + "/config.json")); }

}  // namespace

TEST_CASE("default run folders: runs started in the same second get folders of their own", "[first-hour][solo]") {
  const std::string dir = tempDir();
  // Three at once, two launchers of one rank and one of two ranks, each
  // shorter than a second; no --out.
  const std::string run = "'" + ddpRunPath() + "' '" + kWine + "' --set training.epochs=2";
  const std::string command = "cd '" + dir + "' && (" + run + " > a.log 2>&1 & " + run +
                              " --set optimizer.lr=0.01 > b.log 2>&1 & " + "'" + ddpRunPath() +
                              "' --nproc-per-node 2 '" + kWine + "' --set training.epochs=2 > c.log 2>&1 & wait)";
  REQUIRE(std::system(command.c_str()) == 0);
  std::vector<std::string> folders;
  for (const auto& entry : std::filesystem::directory_iterator(dir + "/runs")) folders.push_back(entry.path());
  REQUIRE(folders.size() == 3);
  for (const char* log : {"a.log", "b.log", "c.log"}) {
    INFO(readFile(dir + "/" + log));
    CHECK(readFile(dir + "/" + log).find("done: ") != std::string::npos);
  }
  for (const auto& folder : folders) CHECK(std::filesystem::exists(folder + "/metrics.jsonl"));
  // A mistake found before training leaves no empty folder behind.
  const std::string bad = "cd '" + dir + "' && '" + ddpRunPath() + "' '" + kWine +
                          "' --set model.layers=[5,3] > d.log 2>&1";
  CHECK(std::system(bad.c_str()) != 0);
  size_t after = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir + "/runs")) after += entry.is_directory();
  CHECK(after == 3);
}

TEST_CASE("config.json records the world the run had, and reproduces it", "[first-hour][solo]") {
  const std::string run = tempDir() + "/two", again = tempDir() + "/again";
  auto outcome = runDdpRun("--nproc-per-node 2 " + kWine + " --out " + run + " --set training.epochs=1");
  REQUIRE(outcome.exitCode == 0);
  CHECK(configOf(run)["distributed"]["nproc_per_node"] == 2);
  CHECK(configOf(run)["distributed"]["nnodes"] == 1);
  outcome = runDdpRun(run + "/config.json --out " + again);
  INFO(outcome.output);
  REQUIRE(outcome.exitCode == 0);
  CHECK_THAT(outcome.output, Contains("2 rank(s) x batch 32"));
  // The same results: the same world, seed and data.
  const auto first = nlohmann::json::parse(readFile(run + "/metrics.jsonl"));
  const auto second = nlohmann::json::parse(readFile(again + "/metrics.jsonl"));
  for (const char* key : {"train_loss", "test_loss", "test_accuracy"}) CHECK(first[key] == second[key]);
  // One rank records 1, whatever the file said.
  const std::string one = tempDir() + "/one";
  outcome = runDdpRun("--nproc-per-node 1 " + std::string(DDP_SOURCE_DIR) + "/experiments/wine_ddp.json --out " + one +
                      " --set training.epochs=1");
  REQUIRE(outcome.exitCode == 0);
  CHECK(configOf(one)["distributed"]["nproc_per_node"] == 1);
}

TEST_CASE("resume says a finished run is finished, and resume with --out DIR alone needs no experiment file",
          "[first-hour][checkpoint][solo]") {
  const std::string run = tempDir() + "/done";
  auto outcome = runDdpRun(kWine + " --out " + run + " --set training.epochs=2 --set training.save_every=1");
  REQUIRE(outcome.exitCode == 0);
  outcome = runDdpRun("--resume --out " + run);
  INFO(outcome.output);
  CHECK(outcome.exitCode == 0);
  CHECK_THAT(outcome.output, Contains("has finished its 2 epoch(s); nothing to train. HINT: --set training.epochs=3"));
  outcome = runDdpRun("--resume --out " + run + " --set training.epochs=3");
  INFO(outcome.output);
  CHECK(outcome.exitCode == 0);
  CHECK_THAT(outcome.output, Contains("epoch 3/3"));
  outcome = runDdpRun("--resume --out " + tempDir() + "/nothing");
  CHECK(outcome.exitCode == 2);
  CHECK_THAT(outcome.output, Contains("holds no config.json to continue from"));
}

TEST_CASE("a resume of a run killed inside its first epoch starts over with its steps.jsonl set aside",
          "[first-hour][checkpoint]") {
  const std::string run = tempDir() + "/killed";
  // Rank 0 dies at step 3 of epoch 1: steps.jsonl has 3 records, metrics.jsonl none.
  auto outcome = runDdpRun(kWine + " --out " + run + " --set training.epochs=2", "DDP_FAULT_INJECT=0@3");
  REQUIRE(outcome.exitCode != 0);
  REQUIRE(ddp::test::jsonLines(run + "/steps.jsonl").size() == 3);
  outcome = runDdpRun("--resume --out " + run);
  INFO(outcome.output);
  CHECK(outcome.exitCode == 0);
  CHECK_THAT(outcome.output, Contains("resume: no checkpoint to continue from, so training starts over; the earlier "
                                      "records are kept as "));
  CHECK_THAT(outcome.output, Contains("steps.before-restart-1.jsonl in " + run));
  const auto kept = ddp::test::jsonLines(run + "/steps.before-restart-1.jsonl");
  CHECK(kept.size() == 3);
  // The new steps.jsonl holds this attempt's steps alone, from step 1, once each.
  const auto steps = ddp::test::jsonLines(run + "/steps.jsonl");
  REQUIRE(!steps.empty());
  for (size_t i = 0; i < steps.size(); ++i) CHECK(steps[i]["step"].get<int64_t>() == int64_t(i) + 1);
}

TEST_CASE("first-hour mistakes get one line and a hint", "[first-hour][config][solo]") {
  auto outcome = runDdpRun("--sample x --seed -1");
  CHECK(outcome.exitCode == 2);
  CHECK_THAT(outcome.output, Contains("--seed: expected a whole number from 0 to 9223372036854775807, got '-1'"));
  outcome = runDdpRun("--sample x --seed 18446744073709551616");
  CHECK(outcome.exitCode == 2);
  outcome = runDdpRun("--sample x " + kWine);
  CHECK(outcome.exitCode == 2);
  CHECK_THAT(outcome.output, Contains("--sample reads the model and its settings from x/config.json"));
  outcome = runDdpRun(kWine + " --set training.lr=0.1");
  CHECK(outcome.exitCode == 2);
  CHECK_THAT(outcome.output, Contains("HINT: \"lr\" belongs in optimizer: optimizer.lr"));
  outcome = runDdpRun(kWine + " --set optimizer.learning_rate=0.1");
  CHECK_THAT(outcome.output, Contains("HINT: this section calls it \"lr\": optimizer.lr"));
  outcome = runDdpRun(kWine + " --set training.nproc_per_node=2");
  CHECK_THAT(outcome.output, Contains("belongs in distributed: distributed.nproc_per_node"));
  outcome = runDdpRun(kWine + " --set model.name=MLP");
  CHECK_THAT(outcome.output, Contains("did you mean \"mlp\"?"));
  outcome = runDdpRun("--describe model");
  CHECK(outcome.exitCode == 0);
  CHECK_THAT(outcome.output, Contains("mlp") && Contains("cnn") && Contains("gpt"));
  outcome = runDdpRun("--describe model.transformer");
  CHECK(outcome.exitCode == 2);
  CHECK_THAT(outcome.output, Contains("--plugin-lib LIBRARY --describe model.transformer"));
  outcome = runDdpRun("--version");
  CHECK(outcome.exitCode == 0);
  CHECK_THAT(outcome.output, Contains("ddp-run ") && Contains("plugin API version") && Contains("LibTorch ") &&
                                 Contains("backends: gloo"));
}

TEST_CASE("mlp sizes its first and last layers from the data by default", "[first-hour][models]") {
  const std::string dir = tempDir();
  const std::string exp = ddp::test::writeFileIn(dir, "blobs.json", R"({
    "name": "blobs",
    "dataset": {"name": "synthetic", "features": 5, "classes": 3, "samples": 200},
    "model": "mlp",
    "optimizer": {"name": "adam", "lr": 0.01},
    "loss": "cross_entropy",
    "training": {"epochs": 2}
  })");
  const auto outcome = runDdpRun(exp + " --out " + dir + "/run");
  INFO(outcome.output);
  CHECK(outcome.exitCode == 0);
  CHECK(configOf(dir + "/run")["model"]["layers"] == nlohmann::json::array({0, 64, 0}));
}

TEST_CASE("sampling never ends inside a UTF-8 character", "[first-hour]") {
  using ddp::apps::completeUtf8;
  CHECK(completeUtf8("") == 0);
  CHECK(completeUtf8("abc") == 3);
  CHECK(completeUtf8("caf\xc3\xa9") == 5);   // é whole
  CHECK(completeUtf8("caf\xc3") == 3);       // é cut after its first byte
  CHECK(completeUtf8("\xe2\x82\xac") == 3);  // €
  CHECK(completeUtf8("x\xe2\x82") == 1);
  CHECK(completeUtf8("\xf0\x9f\x98\x80") == 4);  // an emoji
  CHECK(completeUtf8("\xf0\x9f\x98") == 0);
  CHECK(completeUtf8("\x80\x80") == 2);  // stray continuation bytes pass
}

TEST_CASE("first-hour output: one rank prefix, short runs logged, huge losses readable, cuda refused early",
          "[first-hour][launcher][solo]") {
  auto outcome = runDdpRun("--nproc-per-node 2 " + kWine + " --out " + tempDir() + "/pfx --set training.epochs=1",
                           "GLOO_SOCKET_IFNAME=eth9");
  CHECK(outcome.exitCode != 0);
  CHECK_THAT(outcome.output, Contains("cannot open a TCP device on interface eth9"));
  CHECK(outcome.output.find("[rank 1] [rank 1]") == std::string::npos);
  CHECK(outcome.output.find("last lines of rank") == std::string::npos);  // shown above already
  const std::string shortRun = tempDir() + "/short";
  outcome = runDdpRun(kWine + " --out " + shortRun + " --set training.max_steps=3 --set training.epochs=5");
  REQUIRE(outcome.exitCode == 0);
  CHECK_THAT(outcome.output, Contains("5 epochs (at most 3 steps: training.max_steps)"));
  CHECK(ddp::test::splitWords(readFile(shortRun + "/steps.jsonl")).size() >= 3);  // a record per step
  outcome = runDdpRun(kWine + " --out " + tempDir() + "/big --set optimizer.lr=1e9 --set training.epochs=1 "
                      "--set training.on_nonfinite_loss=continue");
  CHECK_THAT(outcome.output, Contains("train_loss ") && Contains("e+"));
  outcome = runDdpRun("--nproc-per-node 2 " + kWine + " --out " + tempDir() + "/cuda --set distributed.device=cuda");
  if (ddp::test::cudaDevices() == 0) {
    CHECK(outcome.exitCode == 2);
    CHECK_THAT(outcome.output, Contains("distributed.device: \"cuda\" needs a CUDA build"));
    CHECK(outcome.output.find("world size 2") == std::string::npos);  // before any rank starts
  }
}

TEST_CASE("Ctrl-C on a one-rank run stops at a step, says so, and train.log keeps it", "[first-hour][launcher]") {
  const std::string dir = tempDir() + "/int";
  // SIGINT once training runs (steps.jsonl has a record), not after a
  // fixed delay that a loaded machine may not reach training in.
  const std::string command = "'" + ddpRunPath() + "' '" + kWine + "' --out " + dir +
                              " --set training.epochs=1000000 --set training.eval_every=0 --set training.log_every=1 > " +
                              dir + ".log 2>&1 & pid=$!; for i in $(seq 600); do [ -s " + dir +
                              "/steps.jsonl ] && break; sleep 0.05; done; kill -INT $pid; wait $pid";
  const int status = std::system(command.c_str());
  CHECK(WEXITSTATUS(status) == 130);
  INFO(readFile(dir + ".log"));
  CHECK_THAT(readFile(dir + ".log"), Contains("interrupted by SIGINT at step"));
  CHECK_THAT(readFile(dir + "/train.log"), Contains("interrupted by SIGINT at step") && Contains("no checkpoint saved"));
}

TEST_CASE("a CSV's target is named by its header, as pandas users write it", "[first-hour][datasets]") {
  const std::string dir = tempDir();
  std::string csv = "alcohol,quality,acidity\n";
  for (int i = 0; i < 40; ++i) csv += fmt::format("{},{},{}\n", i % 7, i % 2, (i * 3) % 5);
  ddp::test::writeFileIn(dir, "table.csv", csv);
  const std::string exp = ddp::test::writeFileIn(dir, "table.json", R"({
    "dataset": {"name": "csv", "path": "table.csv", "target": "quality"},
    "model": "mlp", "optimizer": "adam", "loss": "cross_entropy", "training": {"epochs": 1}})");
  auto outcome = runDdpRun(exp + " --out " + dir + "/run");
  INFO(outcome.output);
  CHECK(outcome.exitCode == 0);
  CHECK(nlohmann::json::parse(readFile(dir + "/run/model_context.json"))["sample_shape"] ==
        nlohmann::json::array({2}));  // alcohol and acidity
  outcome = runDdpRun(exp + " --out " + dir + "/typo --set dataset.target=qualty");
  CHECK(outcome.exitCode == 2);
  CHECK_THAT(outcome.output, Contains("no column \"qualty\"") && Contains("did you mean \"quality\"?"));
}

TEST_CASE("progress inside an epoch reaches a pipe as plain lines", "[first-hour]") {
  const auto outcome = runDdpRun(kWine + " --out " + tempDir() + "/progress --set training.epochs=2",
                                 "DDP_PROGRESS_SECONDS=0");
  REQUIRE(outcome.exitCode == 0);
  CHECK_THAT(outcome.output, Contains("  epoch 1/2  batch 1/5  loss ") && Contains("samples/s  ETA"));
  CHECK(outcome.output.find('\r') == std::string::npos);  // no terminal rewriting in a pipe
}

TEST_CASE("more ranks than cores gets a note", "[first-hour][launcher][solo]") {
  const unsigned cores = std::thread::hardware_concurrency();
  if (cores == 0 || cores > 8) {
    WARN("SKIPPED: this machine has " << cores << " cores; the test starts cores + 1 ranks only on small machines");
    return;
  }
  const auto outcome = runDdpRun("--nproc-per-node " + std::to_string(cores + 1) + " " + kWine + " --out " + tempDir() +
                                 "/many --set training.epochs=1");
  CHECK(outcome.exitCode == 0);
  CHECK_THAT(outcome.output, Contains(fmt::format("{} ranks on this node (--nproc-per-node) for {} cores", cores + 1,
                                                  cores)));
}
