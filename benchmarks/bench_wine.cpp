// `ddp-bench wine`: wall time of the wine baseline (100 epochs of
// experiments/wine_baseline.json) run in-process through runTraining, against
// the same loop in PyTorch (reference/wine_torch.py).
//
// Both sides time the same two spans. "seconds" is the epoch loop: per epoch
// a shuffle, the steps, the train loss, and every eval_every (10) epochs and
// at the end the test loss and accuracy (ours also writes its metrics
// records; TrainResult::loopSeconds). "total_seconds" adds loading and
// standardizing the CSV and building model and optimizer (runTraining from
// call to return; Python from before loading to the end of the loop).
// Python's interpreter start and `import torch` are in neither. The target
// ratio is on "seconds". The two sides alternate repeat by repeat.
//
// The experiment is tiny, so the time is dominated by per-step overhead
// (dispatch, optimizer, metrics), which is what this benchmark is meant to
// expose. Both sides use one intra-op thread, so that thread pools do not
// decide the comparison.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <utility>

#include "plugins/builtin.hpp"
#include "backends/builtin.hpp"
#include "benchmarks/bench_python.hpp"
#include "benchmarks/bench_util.hpp"
#include "benchmarks/commands.hpp"
#include "ddp/config.hpp"
#include "framework/core/compute_threads.hpp"
#include "framework/comm/backend_registry.hpp"
#include "framework/experiment/experiment_config.hpp"
#include "framework/store/hash_store.hpp"
#include "framework/experiment/trainer.hpp"

namespace ddp::bench {
// The command's own names, in a namespace of their own (not an unnamed one,
// which unity batches would merge with the other commands').
namespace wine {

using nlohmann::json;

struct Options {
  std::string jsonPath;
  std::string plotPath;
  int repeats = 5;
};

// The in-process side: the config and a world-size-1 group, built once.
class Ours {
 public:
  Ours() : dir_("ddp-bench-wine-") {
    setComputeThreads(1);  // ATen's and OpenBLAS's (compute_threads.hpp)
    const std::string path = std::string(DDP_SOURCE_DIR) + "/experiments/wine_baseline.json";
    // No checkpoints: the benchmark times training, not disk writes.
    config_ = loadExperimentConfig(path, {"training.save_every=0"}, builtinPlugins());
    // World size 1 in this process: a HashStore needs no rendezvous.
    dist_.store = std::make_shared<HashStore>();
    dist_.group = builtinBackends().create("gloo", dist_.store, 0, 1);
  }

  // One whole run: {loop seconds, total seconds}.
  std::pair<double, double> run(int i) {
    // A fresh run directory each time, so no repeat resumes or appends to
    // another's metrics.
    RunOptions run;
    run.runDir = dir_.path() + "/run" + std::to_string(i);
    std::filesystem::create_directories(run.runDir);
    run.quiet = true;
    run.progress = false;
    const auto start = std::chrono::steady_clock::now();
    last_ = runTraining(config_, dist_, run, builtinPlugins());
    const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (last_.history.empty()) throw BenchError("runTraining ran no epoch");
    return {last_.loopSeconds, total};
  }

  json record(const std::vector<double>& loop, const std::vector<double>& total) const {
    const EpochMetrics& final = last_.history.back();
    return json{{"impl", "ddp"},
                {"seconds", median(loop)},
                {"total_seconds", median(total)},
                {"final_train_loss", final.trainLoss},
                {"test_loss", final.testLoss ? json(*final.testLoss) : json(nullptr)},
                {"test_accuracy", final.testAccuracy ? json(*final.testAccuracy) : json(nullptr)}};
  }

 private:
  TempDir dir_;
  ExperimentConfig config_;
  DistributedContext dist_;
  TrainResult last_;
};

// One run of reference/wine_torch.py: its JSON record.
json runTorchPythonOnce() {
  const std::string command = pythonCommandForThreads(1) + " " + shellQuote(std::string(DDP_SOURCE_DIR) + "/benchmarks/reference/wine_torch.py") +
                              " --data " + shellQuote(std::string(DDP_SOURCE_DIR) + "/data/wine.csv");
  auto lines = runJsonLines(command);
  if (lines.empty()) throw BenchError("wine_torch.py printed no JSON line");
  return lines.back();
}

double numberOr(const json& r, const char* key) {
  return r.contains(key) && r[key].is_number() ? r[key].get<double>() : std::numeric_limits<double>::quiet_NaN();
}

void runWine(const Options& o) {
  checkOutputPaths(o.jsonPath, o.plotPath);
  if (o.repeats < 1) throw BenchError("--repeats must be at least 1");
  std::optional<std::string> noPython = pythonTorchUnavailable();
  if (noPython) std::cout << "skipping torch-python: " << *noPython << "\n";
  // The two sides alternate, repeat by repeat, so that a change in the
  // machine's load during the run hits both alike.
  Ours ours;
  std::vector<double> ourLoop, ourTotal, theirLoop, theirTotal;
  json theirs;
  for (int i = 0; i < o.repeats; ++i) {
    const auto [loop, total] = ours.run(i);
    ourLoop.push_back(loop);
    ourTotal.push_back(total);
    std::cerr << fmt::format("  ddp repeat {}: loop {:.4f} s, total {:.4f} s\n", i + 1, loop, total);
    if (noPython) continue;
    theirs = runTorchPythonOnce();
    theirLoop.push_back(theirs.at("seconds").get<double>());
    theirTotal.push_back(theirs.value("total_seconds", theirLoop.back()));
    std::cerr << fmt::format("  torch-python repeat {}: loop {:.4f} s, total {:.4f} s\n", i + 1, theirLoop.back(),
                             theirTotal.back());
  }
  json records = json::array();
  records.push_back(ours.record(ourLoop, ourTotal));
  if (!noPython) {
    theirs["impl"] = "torch-python";
    theirs["seconds"] = median(theirLoop);
    theirs["total_seconds"] = median(theirTotal);
    records.push_back(theirs);
  }

  Table table({"impl", "seconds", "total_seconds", "final_train_loss", "test_loss", "test_accuracy"});
  for (const auto& r : records) {
    table.addRow({r["impl"].get<std::string>(), formatFixed(numberOr(r, "seconds"), 4),
                  formatFixed(numberOr(r, "total_seconds"), 4), formatFixed(numberOr(r, "final_train_loss"), 4),
                  formatFixed(numberOr(r, "test_loss"), 4), formatFixed(numberOr(r, "test_accuracy"), 4)});
  }
  std::cout << table.render();
  if (records.size() == 2) {
    std::cout << fmt::format(
        "ratio ddp/torch-python wall time: {:.2f}x for the epoch loop (target <= 0.30), {:.2f}x in total\n",
        numberOr(records[0], "seconds") / numberOr(records[1], "seconds"),
        numberOr(records[0], "total_seconds") / numberOr(records[1], "total_seconds"));
  }
  writeRecords(o.jsonPath, o.plotPath, records);
}

}  // namespace wine

void registerWineCommand(CLI::App& app) {
  using namespace wine;
  auto options = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("wine", "Time the 100-epoch wine baseline in-process vs PyTorch in Python");
  cmd->add_option("--json", options->jsonPath, "Also write the records to this JSON file");
  cmd->add_option("--plot", options->plotPath, "Also draw our loop time against PyTorch's into this PNG (scripts/ddp-plot)");
  cmd->add_option("--repeats", options->repeats, "Runs per implementation (the median is reported)")
      ->capture_default_str();
  cmd->callback([options] {
    try {
      runWine(*options);
    } catch (const std::exception& e) {
      std::cerr << "ddp-bench wine: error: " << e.what() << "\n";
      throw CLI::RuntimeError(1);
    }
  });
}

}  // namespace ddp::bench
