// `ddp-bench lm`: the quality of a language model trained by this framework
// against the same training in PyTorch's Python, in one invocation.
//
// Ours: `ddp-run EXPERIMENT` (default experiments/char_gpt.json, 2 ranks)
// into a temporary run folder; its last metrics record gives the validation
// loss per token. Theirs: reference/char_gpt_torch.py, given that run's
// resolved config.json, trains the same model on the same split with
// PyTorch's DDP and evaluates on the same validation windows. The two draw
// windows in different orders (each from its own generator), so their
// losses agree to within run-to-run noise; the target is 5%.
//
// That noise is large for a small model early in training: when the loss
// leaves its first plateau (the byte frequencies) depends on the seed, and
// one side's single run can land 15% above the other's. So each side trains
// once per seed of --seeds (default 0 and 1000: epoch e shuffles with seed
// + e, so nearby seeds share orders) and the target compares the means;
// every run is a row of the table. The reference takes its batches in our
// sampler's order (reference/distributed_sampler.py), so with one seed both
// sides start from the same weights and see the same batches.
//
// Also printed: parameters, optimizer steps, and each side's wall time of
// its epoch loop (ours: the sum of the epochs' seconds in metrics.jsonl).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include "benchmarks/bench_python.hpp"
#include "benchmarks/bench_util.hpp"
#include "benchmarks/commands.hpp"
#include "ddp/config.hpp"

namespace ddp::bench {
// The command's own names, in a namespace of their own (not an unnamed one,
// which unity batches would merge with the other commands').
namespace lm {

using nlohmann::json;

struct Options {
  std::string experiment = std::string(DDP_SOURCE_DIR) + "/experiments/char_gpt.json";
  std::vector<std::string> overrides;
  // Far apart: each epoch shuffles with seed + epoch, so seeds 0 and 1 would
  // share all but one epoch's order.
  std::vector<int64_t> seeds = {0, 1000};
  std::string jsonPath;
  std::string plotPath;
  double tolerance = 0.05;
};

json lastRecord(const std::string& path) {
  std::ifstream in(path);
  std::string line, last;
  double seconds = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    last = line;
    seconds += json::parse(line).value("seconds", 0.0);
  }
  if (last.empty()) throw BenchError(fmt::format("{} holds no record", path));
  json record = json::parse(last);
  record["loop_seconds"] = seconds;
  return record;
}

// One seed: ours into DIR/ours-SEED, then the reference on its config.json.
// Returns ours' record, and the reference's when Python can run it.
json runSeed(const Options& o, const TempDir& dir, int64_t seed) {
  const std::string runDir = fmt::format("{}/ours-{}", dir.path(), seed);
  std::string command = shellQuote(DDP_RUN_PATH) + " " + shellQuote(o.experiment) + " --out " + shellQuote(runDir);
  for (const std::string& set : o.overrides) command += " --set " + shellQuote(set);
  command += " --set training.seed=" + std::to_string(seed);
  const std::string log = runDir + ".log";
  std::cerr << "ddp-bench lm: seed " << seed << ": training ours: " << command << "\n";
  if (std::system((command + " > " + shellQuote(log) + " 2>&1").c_str()) != 0) {
    std::ifstream in(log);
    std::stringstream text;
    text << in.rdbuf();
    throw BenchError(fmt::format("ddp-run failed (seed {}):\n{}", seed, text.str()));
  }
  // Our step count, from ddp-run's last line ("done: N steps; ...").
  int64_t steps = -1;
  {
    std::ifstream in(log);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("done: ", 0) == 0) steps = std::stoll(line.substr(6));
    }
  }
  const json config = readJsonFile(runDir + "/config.json");
  const json last = lastRecord(runDir + "/metrics.jsonl");
  json records = json::array();
  records.push_back({{"impl", "ddp"},
                     {"seed", seed},
                     {"world_size", config["distributed"]["nproc_per_node"]},
                     {"steps", steps},
                     {"val_loss", last.at("test_loss")},
                     {"seconds", last["loop_seconds"]}});
  if (pythonTorchUnavailable()) return records;
  std::cerr << "ddp-bench lm: seed " << seed << ": training the PyTorch reference\n";
  const auto lines = runJsonLines(
      pythonCommandForThreads(1) + " " + shellQuote(std::string(DDP_SOURCE_DIR) + "/benchmarks/reference/char_gpt_torch.py") +
      " --config " + shellQuote(runDir + "/config.json"));
  if (lines.empty()) throw BenchError("char_gpt_torch.py printed no JSON line");
  json theirs = lines.back();
  theirs["seed"] = seed;
  records[0]["params"] = theirs.value("params", 0);
  records.push_back(theirs);
  return records;
}

double meanOf(const json& records, const std::string& impl, const std::string& key) {
  double sum = 0;
  int n = 0;
  for (const json& r : records) {
    if (r["impl"] == impl) {
      sum += r.at(key).get<double>();
      ++n;
    }
  }
  return n > 0 ? sum / n : std::nan("");
}

void runLm(const Options& o) {
  checkOutputPaths(o.jsonPath, o.plotPath);
  if (o.seeds.empty()) throw BenchError("--seeds: give at least one seed");
  TempDir dir("ddp-bench-lm-");
  if (auto why = pythonTorchUnavailable()) std::cout << "skipping torch-python: " << *why << "\n";
  json records = json::array();
  for (int64_t seed : o.seeds) {
    for (json& r : runSeed(o, dir, seed)) records.push_back(std::move(r));
  }

  Table table({"impl", "seed", "ranks", "params", "steps", "val_loss", "val_ppl", "seconds"});
  for (const json& r : records) {
    const double loss = r.at("val_loss").get<double>();
    table.addRow({r["impl"].get<std::string>(), std::to_string(r.value("seed", 0)),
                  std::to_string(r.value("world_size", 0)), std::to_string(r.value("params", 0)),
                  std::to_string(r.value("steps", 0)), formatFixed(loss, 4), formatFixed(std::exp(loss), 3),
                  formatFixed(r.value("seconds", 0.0), 1)});
  }
  std::cout << table.render();
  const double ours = meanOf(records, "ddp", "val_loss"), theirs = meanOf(records, "torch-python", "val_loss");
  if (!std::isnan(theirs)) {
    const double ratio = ours / theirs;
    const bool within = std::abs(ratio - 1) <= o.tolerance;
    std::cout << fmt::format(
        "mean val loss over {} seed(s): ddp {:.4f}, torch-python {:.4f}; ddp/torch-python {:.4f} ({} the {:.0f}% "
        "target); wall time {:.2f}x\n",
        o.seeds.size(), ours, theirs, ratio, within ? "within" : "OUTSIDE", o.tolerance * 100,
        meanOf(records, "ddp", "seconds") / meanOf(records, "torch-python", "seconds"));
    for (json& r : records) r["mean_val_loss_ratio"] = ratio;
  }
  writeRecords(o.jsonPath, o.plotPath, records);
}

}  // namespace lm

void registerLmCommand(CLI::App& app) {
  using namespace lm;
  auto options = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "lm", "Train a language model experiment with ddp-run and the same in PyTorch; compare validation loss");
  cmd->add_option("--experiment", options->experiment, "the experiment (a gpt on the text dataset)")
      ->capture_default_str();
  cmd->add_option("--set", options->overrides, "override a setting of the experiment, for both sides (repeatable)");
  cmd->add_option("--seeds", options->seeds, "train each side once per seed; the target compares the means")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--tolerance", options->tolerance, "the relative difference of validation loss allowed")
      ->capture_default_str();
  cmd->add_option("--json", options->jsonPath, "Also write the records to this JSON file");
  cmd->add_option("--plot", options->plotPath, "Also draw validation loss and time, ours against the reference into this PNG (scripts/ddp-plot)");
  cmd->callback([options] {
    try {
      runLm(*options);
    } catch (const std::exception& e) {
      std::cerr << "ddp-bench lm: error: " << e.what() << "\n";
      throw CLI::RuntimeError(1);
    }
  });
}

}  // namespace ddp::bench
