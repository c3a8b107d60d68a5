// `ddp-bench wine`: wall time of the whole wine baseline (100 epochs of
// experiments/wine_baseline.json) run in-process through runTraining, against
// the same loop in PyTorch (reference/wine_torch.py).
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

#include "benchmarks/bench_python.hpp"
#include "benchmarks/bench_util.hpp"
#include "benchmarks/commands.hpp"
#include "ddp/config.hpp"
#include "framework/backend_registry.hpp"
#include "framework/experiment_config.hpp"
#include "framework/hash_store.hpp"
#include "framework/trainer.hpp"

namespace ddp::bench {
namespace {

using nlohmann::json;

struct Options {
  std::string jsonPath;
  int repeats = 5;
};

json runOurs(const Options& o) {
  at::set_num_threads(1);
  const std::string path = std::string(DDP_SOURCE_DIR) + "/experiments/wine_baseline.json";
  // No checkpoints: the benchmark times training, not disk writes.
  const ExperimentConfig config = loadExperimentConfig(path, {"training.save_every=0"}, PluginRegistry::global());

  // World size 1 in this process: a HashStore needs no rendezvous.
  DistributedContext dist;
  dist.store = std::make_shared<HashStore>();
  dist.group = BackendRegistry::global().create("gloo", dist.store, 0, 1);

  TempDir dir("ddp-bench-wine-");
  std::vector<double> seconds;
  TrainResult last;
  for (int i = 0; i < o.repeats; ++i) {
    // A fresh run directory each time, so no repeat resumes or appends to
    // another's metrics.
    RunOptions run;
    run.runDir = dir.path() + "/run" + std::to_string(i);
    std::filesystem::create_directories(run.runDir);
    run.quiet = true;
    run.progress = false;
    const auto start = std::chrono::steady_clock::now();
    last = runTraining(config, dist, run);
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    std::cerr << fmt::format("  ddp repeat {}: {:.3f} s\n", i + 1, seconds.back());
  }
  if (last.history.empty()) throw BenchError("runTraining ran no epoch");
  const EpochMetrics& final = last.history.back();
  return json{{"impl", "ddp"},
              {"seconds", median(seconds)},
              {"final_train_loss", final.trainLoss},
              {"test_accuracy", final.testAccuracy ? json(*final.testAccuracy) : json(nullptr)}};
}

json runTorchPython(const Options& o) {
  const std::string command = pythonCommand() + " " + shellQuote(std::string(DDP_SOURCE_DIR) + "/benchmarks/reference/wine_torch.py") +
                              " --data " + shellQuote(std::string(DDP_SOURCE_DIR) + "/data/wine.csv");
  std::vector<double> seconds;
  json last;
  for (int i = 0; i < o.repeats; ++i) {
    auto lines = runJsonLines(command);
    if (lines.empty()) throw BenchError("wine_torch.py printed no JSON line");
    last = lines.back();
    seconds.push_back(last.at("seconds").get<double>());
    std::cerr << fmt::format("  torch-python repeat {}: {:.3f} s\n", i + 1, seconds.back());
  }
  last["impl"] = "torch-python";
  last["seconds"] = median(seconds);
  return last;
}

double numberOr(const json& r, const char* key) {
  return r.contains(key) && r[key].is_number() ? r[key].get<double>() : std::numeric_limits<double>::quiet_NaN();
}

void runWine(const Options& o) {
  if (o.repeats < 1) throw BenchError("--repeats must be at least 1");
  json records = json::array();
  records.push_back(runOurs(o));
  if (auto why = pythonTorchUnavailable()) {
    std::cout << "skipping torch-python: " << *why << "\n";
  } else {
    records.push_back(runTorchPython(o));
  }

  Table table({"impl", "seconds", "final_train_loss", "test_accuracy"});
  for (const auto& r : records) {
    table.addRow({r["impl"].get<std::string>(), formatNumber(numberOr(r, "seconds"), 3),
                  formatNumber(numberOr(r, "final_train_loss"), 4), formatNumber(numberOr(r, "test_accuracy"), 4)});
  }
  std::cout << table.render();
  if (records.size() == 2) {
    std::cout << fmt::format("ratio ddp/torch-python wall time: {:.2f}x (target <= 0.30)\n",
                             numberOr(records[0], "seconds") / numberOr(records[1], "seconds"));
  }
  if (!o.jsonPath.empty()) {
    writeJsonFile(o.jsonPath, records);
    std::cerr << "wrote " << o.jsonPath << "\n";
  }
}

}  // namespace

void registerWineCommand(CLI::App& app) {
  auto options = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("wine", "Time the 100-epoch wine baseline in-process vs PyTorch in Python");
  cmd->add_option("--json", options->jsonPath, "Also write the records to this JSON file");
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
