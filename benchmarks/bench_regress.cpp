// `ddp-bench regress`: the check to run before calling a change to the
// build, the trainer or the communication layer done (README, "Checks
// outside the test command"). It times the training step of the mlp, the
// cnn and the gpt (`ddp-bench train-step --world-sizes 1,2`, each model once
// per round, the models interleaved) and compares three ratios per model,
// each measured within one run and so free of the machine's speed, against
// the ones recorded in the tree (benchmarks/baselines/train_step.json):
//
//   ddp/torch-ddp w2     our DDP step at world size 2 over PyTorch DDP's;
//   ddp/torch-ddp w1     our plain step over PyTorch's (kernels, build flags);
//   independent w2/w1    two of our ranks that never communicate over one
//                        rank alone (what running ranks side by side costs:
//                        threads, memory; issue 44's cause showed here).
//
// For all three, higher is worse. A ratio above the baseline's median by
// more than the baseline's tolerance is reported as SLOWER and the command
// exits 1; one below by as much says so and suggests recording anew. The
// tolerance is the spread measured when the baseline was recorded
// (`--record`, at least 3 rounds: (max - min) / median), and never less than
// --min-tolerance.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <thread>

#include <sys/wait.h>

#include "benchmarks/bench_python.hpp"
#include "benchmarks/bench_util.hpp"
#include "benchmarks/commands.hpp"
#include "framework/core/errors.hpp"
#include "framework/core/strings.hpp"

namespace ddp::bench {
namespace regress {

using nlohmann::json;

struct Options {
  std::vector<std::string> models = {"mlp", "cnn", "gpt"};
  int rounds = 1;
  int steps = 10;
  int warmup = 3;
  int repeats = 3;
  std::string baselinePath = std::string(DDP_SOURCE_DIR) + "/benchmarks/baselines/train_step.json";
  bool record = false;
  double minTolerance = 0.05;
  std::string jsonPath;
  bool noReference = false;
};

// The ratios of one train-step run, by name; a ratio whose records are
// missing (no PyTorch) is absent.
std::map<std::string, double> ratiosOf(const json& records) {
  const auto step = [&](const std::string& impl, int world) -> std::optional<double> {
    for (const auto& r : records) {
      if (r.value("impl", "") == impl && r.value("world_size", 0) == world) return r.at("step_ms").get<double>();
    }
    return std::nullopt;
  };
  std::map<std::string, double> ratios;
  const auto add = [&](const std::string& name, std::optional<double> a, std::optional<double> b) {
    if (a && b && *b > 0) ratios[name] = *a / *b;
  };
  add("ddp/torch-ddp w2", step("ddp", 2), step("torch-ddp", 2));
  add("ddp/torch-ddp w1", step("ddp", 1), step("torch-ddp", 1));
  add("independent w2/w1", step("independent", 2), step("ddp", 1));
  return ratios;
}

std::string selfExecutable() { return std::filesystem::read_symlink("/proc/self/exe").string(); }

// One `ddp-bench train-step` run of `model`; its printed table goes to
// `log` (shown when the run fails).
json runTrainStep(const Options& o, const std::string& model, const std::string& dir, int round) {
  const std::string out = fmt::format("{}/{}.r{}.json", dir, model, round);
  const std::string log = fmt::format("{}/{}.r{}.log", dir, model, round);
  const std::string command =
      fmt::format("{} train-step --model {} --world-sizes 1,2 --steps {} --warmup {} --repeats {}{} --json {} > {} 2>&1",
                  shellQuote(selfExecutable()), model, o.steps, o.warmup, o.repeats,
                  o.noReference ? " --no-reference" : "", shellQuote(out), shellQuote(log));
  const int status = std::system(command.c_str());
  if (status != 0) {
    std::ifstream in(log);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::cerr << text.substr(text.size() > 4000 ? text.size() - 4000 : 0);
    fail<BenchError>("train-step --model {} (round {}) failed (exit status {}); its output is above", model, round,
                     WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  }
  return readJsonFile(out);
}

std::string commandOutput(const std::string& command) {
  std::string text;
  if (FILE* pipe = ::popen(command.c_str(), "r")) {
    char buffer[256];
    while (std::fgets(buffer, sizeof buffer, pipe)) text += buffer;
    ::pclose(pipe);
  }
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

json machineDescription() {
  std::string cpu = commandOutput("sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1");
  return json{{"cores", static_cast<int>(std::thread::hardware_concurrency())}, {"cpu", cpu}};
}

std::string today() {
  std::time_t now = std::time(nullptr);
  char text[16];
  std::strftime(text, sizeof text, "%Y-%m-%d", std::gmtime(&now));
  return text;
}

void runRegress(const Options& o) {
  if (o.rounds < 1 || o.steps < 1 || o.repeats < 1 || o.warmup < 0) {
    throw BenchError("--rounds, --steps and --repeats must be at least 1, --warmup at least 0");
  }
  if (o.record && o.rounds < 3) {
    throw BenchError("--record measures the noise too, so it needs --rounds 3 or more. HINT: --record --rounds 5");
  }
  for (const auto& m : o.models) {
    if (m != "mlp" && m != "cnn" && m != "gpt") fail<BenchError>("--models: unknown model \"{}\" (mlp, cnn, gpt)", m);
  }
  json baseline;
  if (!o.record) {
    if (!std::filesystem::exists(o.baselinePath)) {
      fail<BenchError>("no baseline at {}. HINT: record one with `ddp-bench regress --record --rounds 5`",
                       o.baselinePath);
    }
    baseline = readJsonFile(o.baselinePath);
    if (!baseline.contains("ratios") || !baseline["ratios"].is_object()) {
      fail<BenchError>("{}: not a baseline of ddp-bench regress (no \"ratios\" object)", o.baselinePath);
    }
    const json here = machineDescription();
    if (baseline.contains("machine") && baseline["machine"].value("cores", 0) != here["cores"].get<int>()) {
      std::cout << fmt::format("# note: the baseline was recorded on {} cores ({}), this machine has {}: ratios at "
                               "world size 2 depend on it\n",
                               baseline["machine"].value("cores", 0), baseline["machine"].value("cpu", "?"),
                               here["cores"].get<int>());
    }
    std::cout << fmt::format("# baseline: {} ({}, commit {})\n", o.baselinePath, baseline.value("recorded", "?"),
                             baseline.value("commit", "?"));
  }
  if (o.record && o.noReference) {
    throw BenchError("--record needs PyTorch's side. HINT: drop --no-reference");
  }
  if (o.noReference) {
    std::cout << "# --no-reference: only independent w2/w1 is checked\n";
  } else if (auto why = pythonTorchUnavailable()) {
    std::cout << "# no PyTorch reference (" << *why << "): only independent w2/w1 is checked\n";
  }

  TempDir dir("ddp-bench-regress-");
  std::map<std::string, std::map<std::string, std::vector<double>>> measured;  // model -> ratio -> per round
  for (int round = 1; round <= o.rounds; ++round) {
    for (const auto& model : o.models) {
      std::cerr << fmt::format("regress: round {}/{}, {}...\n", round, o.rounds, model);
      const auto ratios = ratiosOf(runTrainStep(o, model, dir.path(), round));
      std::string line;
      for (const auto& [name, value] : ratios) {
        measured[model][name].push_back(value);
        line += fmt::format("  {} {:.3f}x", name, value);
      }
      std::cerr << fmt::format("regress: round {}/{}, {}:{}\n", round, o.rounds, model, line);
    }
  }

  if (o.record) {
    json ratios = json::object();
    Table table({"model", "ratio", "median", "min", "max", "tolerance"}, 2);
    for (const auto& [model, byName] : measured) {
      for (const auto& [name, values] : byName) {
        const double mid = median(values);
        const double lo = *std::min_element(values.begin(), values.end());
        const double hi = *std::max_element(values.begin(), values.end());
        const double tolerance = std::max(o.minTolerance, (hi - lo) / mid);
        ratios[model][name] = json{{"median", mid}, {"values", values}, {"tolerance", tolerance}};
        table.addRow({model, name, formatFixed(mid, 3) + "x", formatFixed(lo, 3) + "x", formatFixed(hi, 3) + "x",
                      fmt::format("{:.1f}%", 100 * tolerance)});
      }
    }
    std::cout << table.render();
    json out{{"recorded", today()},
             {"commit", commandOutput(fmt::format("git -C {} rev-parse --short HEAD 2>/dev/null",
                                                  shellQuote(DDP_SOURCE_DIR)))},
             {"machine", machineDescription()},
             {"settings", {{"rounds", o.rounds}, {"steps", o.steps}, {"warmup", o.warmup}, {"repeats", o.repeats}}},
             {"ratios", ratios}};
    std::filesystem::create_directories(std::filesystem::path(o.baselinePath).parent_path());
    writeJsonFile(o.baselinePath, out);
    if (!o.jsonPath.empty()) writeJsonFile(o.jsonPath, out);
    size_t count = 0;
    for (const auto& [model, byName] : measured) count += byName.size();
    std::cout << fmt::format("regress: recorded {} ratios of {} rounds in {}\n", count, o.rounds, o.baselinePath);
    return;
  }

  Table table({"model", "ratio", "baseline", "now", "change", "tolerance", "verdict"}, 2);
  std::vector<std::string> slower, faster;
  json results = json::array();
  int checked = 0;
  for (const auto& [model, byName] : measured) {
    for (const auto& [name, values] : byName) {
      const double now = median(values);
      const json* base = nullptr;
      if (baseline["ratios"].contains(model) && baseline["ratios"][model].contains(name)) {
        base = &baseline["ratios"][model][name];
      }
      if (!base) {
        table.addRow({model, name, "-", formatFixed(now, 3) + "x", "-", "-", "not in the baseline"});
        continue;
      }
      ++checked;
      const double was = base->at("median").get<double>();
      const double tolerance = std::max(o.minTolerance, base->value("tolerance", o.minTolerance));
      const double change = now / was - 1;
      std::string verdict = "ok";
      if (change > tolerance) {
        verdict = "SLOWER";
        slower.push_back(fmt::format("{} {} is {:.3f}x, baseline {:.3f}x: {:+.1f}%, beyond the {:.1f}% noise measured "
                                     "when it was recorded",
                                     model, name, now, was, 100 * change, 100 * tolerance));
      } else if (change < -tolerance) {
        verdict = "faster";
        faster.push_back(fmt::format("{} {} {:.3f}x (baseline {:.3f}x)", model, name, now, was));
      }
      table.addRow({model, name, formatFixed(was, 3) + "x", formatFixed(now, 3) + "x",
                    fmt::format("{:+.1f}%", 100 * change), fmt::format("{:.1f}%", 100 * tolerance), verdict});
      results.push_back(json{{"model", model}, {"ratio", name}, {"baseline", was}, {"now", now}, {"values", values},
                             {"tolerance", tolerance}, {"verdict", verdict}});
    }
  }
  std::cout << table.render();
  if (!o.jsonPath.empty()) writeJsonFile(o.jsonPath, results);
  for (const auto& line : faster) {
    std::cout << "regress: faster than the baseline: " << line
              << " (record the new numbers with `ddp-bench regress --record --rounds 5` once confirmed)\n";
  }
  if (checked == 0) throw BenchError("no ratio could be checked against the baseline (see the table)");
  if (!slower.empty()) {
    for (const auto& line : slower) std::cout << "regress: SLOWER: " << line << "\n";
    std::cout << fmt::format("regress: {} of {} ratios slower than the baseline; rerun with --rounds 3 to tell a "
                             "change from a noisy spell\n",
                             slower.size(), checked);
    throw CLI::RuntimeError(1);
  }
  std::cout << fmt::format("regress: {} ratios checked, none slower than the baseline beyond its noise\n", checked);
}

}  // namespace regress

void registerRegressCommand(CLI::App& app) {
  using namespace regress;
  auto options = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "regress", "Check the train-step ratios of mlp, cnn and gpt against the baseline recorded in the tree");
  cmd->add_option("--models", options->models, "Models to time (mlp, cnn, gpt)")->delimiter(',')->capture_default_str();
  cmd->add_option("--rounds", options->rounds, "Runs of each model, interleaved (the median ratio is compared)")
      ->capture_default_str();
  cmd->add_option("--steps", options->steps, "Timed steps of each train-step run")->capture_default_str();
  cmd->add_option("--warmup", options->warmup, "Untimed steps first")->capture_default_str();
  cmd->add_option("--repeats", options->repeats, "train-step's interleaved repeats per configuration")
      ->capture_default_str();
  cmd->add_option("--baseline", options->baselinePath, "The recorded ratios")->capture_default_str();
  cmd->add_flag("--record", options->record, "Measure and write the baseline instead of checking against it");
  cmd->add_option("--min-tolerance", options->minTolerance, "The least relative change reported")
      ->capture_default_str();
  cmd->add_option("--json", options->jsonPath, "Also write the comparison (or the recorded baseline) here");
  cmd->add_flag("--no-reference", options->noReference,
                "Skip PyTorch's side: only our independent w2/w1 ratio is checked (a quick look)");
  cmd->callback([options] {
    try {
      runRegress(*options);
    } catch (const CLI::RuntimeError&) {
      throw;
    } catch (const std::exception& e) {
      std::cerr << "ddp-bench regress: error: " << e.what() << "\n";
      throw CLI::RuntimeError(1);
    }
  });
}

}  // namespace ddp::bench
