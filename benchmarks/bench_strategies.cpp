// `ddp-bench strategies`: the parallel strategies (ddp, zero1, zero2) on one
// model, side by side, against PyTorch's DDP, ZeroRedundancyOptimizer and
// FSDP (reference/strategies_torch.py) in the same invocation.
//
// The model is an MLP (default 2048-4096-4096-4096-2048, 50.4M parameters)
// trained with Adam on random data, batch 32 per rank, one intra-op thread
// per rank, ranks as processes (this executable again with hidden
// --worker-* flags), one strategy after the other. Per strategy: the
// median step time, and per rank (the largest over ranks) the bytes held in
// parameters, gradients and optimizer state between steps
// (ParallelStrategy::heldBytes) and the peak resident memory.
//
// What it checks: every rank ends with rank 0's parameters, and every
// strategy ends with ddp's (the sum and the sum of absolute values of all
// parameters, to 1e-4 relative). PyTorch's side starts from the same
// weights and batches (same seeds and initialisation on LibTorch 1.13), so
// its sums are compared too and printed.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>

#include "backends/builtin.hpp"
#include "benchmarks/bench_python.hpp"
#include "benchmarks/bench_util.hpp"
#include "benchmarks/commands.hpp"
#include "ddp/config.hpp"
#include "benchmarks/sim_cluster.hpp"
#include "framework/comm/backend_registry.hpp"
#include "framework/comm/sub_groups.hpp"
#include "framework/core/compute_threads.hpp"
#include "framework/core/errors.hpp"
#include "framework/core/strings.hpp"
#include "framework/core/system.hpp"
#include "framework/experiment/plugin_registry.hpp"
#include "framework/parallel/fsdp_strategy.hpp"
#include "framework/parallel/model_sync.hpp"
#include "framework/parallel/strategy.hpp"
#include "framework/parallel/strategy_footprint.hpp"
#include "framework/store/tcp_store.hpp"
#include "plugins/builtin.hpp"

namespace ddp::bench {
// The command's own names, in a namespace of their own (not an unnamed one,
// which unity batches would merge with the other commands').
namespace strategies {

using nlohmann::json;


struct Options {
  bool plan = false;
  std::vector<int> planRanks = {8, 64, 512};
  std::vector<std::string> strategies = {"ddp", "zero1", "zero2", "fsdp"};
  std::vector<int64_t> widths = {2048, 4096, 4096, 4096, 2048};
  std::string model = "mlp";  // or "gpt"
  int64_t gptLayers = 13, gptWidth = 576, gptBlock = 64;  // 51.9M parameters
  int worldSize = 2;
  int64_t batch = 32;
  int steps = 5;
  int warmup = 2;
  double lr = 1e-4;
  bool noReference = false;
  std::string jsonPath;
  std::string plotPath;
  int timeoutSeconds = 900;
  bool fsdpBackwardPrefetch = true;
  double fsdpUnitMb = 0;
  int shardSize = 0;     // hsdp: ranks per row (0: the ranks of one host with --hosts, else half the ranks)
  std::string hosts;     // "HxR": a simulated cluster (sim_cluster.hpp)
  std::string link = "1gbit";

  int workerRank = -1;
  std::string workerStrategy, workerDir;
};

// A 7B-parameter decoder in Llama-7B's shapes (32 layers, width 4096, MLP
// 11008, vocabulary 32000, untied embeddings): 6.74e9 parameters.
std::vector<int64_t> llama7bNumels() {
  const int64_t d = 4096, ff = 11008, vocab = 32000;
  std::vector<int64_t> numels = {vocab * d};
  for (int layer = 0; layer < 32; ++layer) {
    numels.push_back(d);  // attention norm
    for (int k = 0; k < 4; ++k) numels.push_back(d * d);  // q, k, v, o
    numels.push_back(d);  // MLP norm
    for (int k = 0; k < 3; ++k) numels.push_back(d * ff);  // gate, up, down
  }
  numels.push_back(d);
  numels.push_back(vocab * d);
  return numels;
}

// Its units under fsdp: each decoder layer; the embeddings, final norm and
// head stay whole (the root, -1).
std::vector<int> llama7bUnits() {
  std::vector<int> units = {-1};
  for (int layer = 0; layer < 32; ++layer) units.insert(units.end(), 9, layer);
  units.push_back(-1);
  units.push_back(-1);
  return units;
}

// --plan: per-rank memory and bytes sent per step of each strategy for the
// 7B model, float32 with Adam, from the same formulas the strategies'
// layouts follow (strategyFootprint).
void printPlan(const Options& o) {
  const std::vector<int64_t> numels = llama7bNumels();
  int64_t total = 0;
  for (int64_t n : numels) total += n;
  std::cout << fmt::format("{:.3f}e9 parameters (Llama-7B shapes), float32, Adam, buckets of 25 MiB\n", total / 1e9);
  Table table({"strategy", "ranks", "params_GiB", "grads_GiB", "optim_GiB", "total_GiB", "sent_GiB_per_step"}, 1);
  const double gib = 1024.0 * 1024 * 1024;
  for (int world : o.planRanks) {
    for (const char* s : {"ddp", "zero1", "zero2", "fsdp"}) {
      const StrategyFootprint f = strategyFootprint(s, numels, world, 4, 2, 25 * 1024 * 1024, llama7bUnits());
      table.addRow({s, std::to_string(world),
                    formatFixed(f.parameterBytes / gib, 2), formatFixed(f.gradientBytes / gib, 2),
                    formatFixed(f.optimizerBytes / gib, 2),
                    formatFixed((f.parameterBytes + f.gradientBytes + f.optimizerBytes) / gib, 2),
                    formatFixed(f.sentBytesPerStep / gib, 2)});
    }
  }
  std::cout << table.render();
}

std::string resultsPath(const std::string& dir, const std::string& strategy) {
  return dir + "/results." + strategy + ".json";
}

// The MLP of --widths (ReLU between layers), each Linear a unit that fsdp
// gathers on its own (sharding_units.hpp). Same parameters, in the same
// order and from the same draws, as models_torch.py's.
class UnitMlp : public Model {
 public:
  explicit UnitMlp(const std::vector<int64_t>& widths) {
    for (size_t i = 0; i + 1 < widths.size(); ++i)
      layers_.push_back(register_module("fc" + std::to_string(i), torch::nn::Linear(widths[i], widths[i + 1])));
  }
  at::Tensor forward(const at::Tensor& input) override {
    at::Tensor x = input;
    for (size_t i = 0; i < layers_.size(); ++i) {
      x = runUnit(i, [&] { return layers_[i]->forward(x); });
      if (i + 1 < layers_.size()) x = torch::relu(x);
    }
    return x;
  }
  std::vector<std::shared_ptr<torch::nn::Module>> shardingUnits() override {
    std::vector<std::shared_ptr<torch::nn::Module>> units;
    for (auto& layer : layers_) units.push_back(layer.ptr());
    return units;
  }

 private:
  std::vector<torch::nn::Linear> layers_;
};

constexpr int64_t kGptVocab = 96;

// The built-in gpt (plugins/models/gpt.hpp) of --gpt-layers blocks of width
// --gpt-width (heads of 64), --gpt-block tokens, a 96-token vocabulary,
// tied head, no dropout; each block is a unit under fsdp.
json gptValues(const Options& o) {
  const PluginSpec& spec = builtinPlugins().get(PluginKind::Model, "gpt");
  json values = json::object();
  for (const auto& p : spec.params)
    if (!p.defaultValue.is_null()) values[p.name] = p.defaultValue;
  values["n_layer"] = o.gptLayers;
  values["n_embd"] = o.gptWidth;
  values["n_head"] = std::max<int64_t>(1, o.gptWidth / 64);
  values["block_size"] = o.gptBlock;
  values["dropout"] = 0.0;
  return values;
}

ModelPtr buildGpt(const Options& o) {
  ModelContext context;
  context.sampleShape = {o.gptBlock};
  context.numFeatures = o.gptBlock;
  context.numClasses = kGptVocab;
  context.vocabSize = kGptVocab;
  return builtinPlugins().get(PluginKind::Model, "gpt").model(Params(gptValues(o)), context);
}

// The reference's --model gpt --gpt '{...}': the same resolved parameters,
// and the vocabulary (models_torch.Gpt).
std::string gptReferenceArguments(const Options& o) {
  if (o.model != "gpt") return "";
  json cfg = gptValues(o);
  cfg["vocab"] = kGptVocab;
  return " --model gpt --gpt " + shellQuote(cfg.dump());
}

// hsdp's ranks per row: --shard-size, else the ranks of one simulated host,
// else half the ranks (at least 1).
int shardSizeOf(const Options& o) {
  if (o.shardSize > 0) return o.shardSize;
  if (!o.hosts.empty()) return parseHostLayout(o.hosts).ranksPerHost;
  return std::max(1, o.worldSize / 2);
}

void runWorker(const Options& o) {
  setComputeThreads(1);  // ATen's and OpenBLAS's (compute_threads.hpp)
  const int rank = o.workerRank;
  const std::chrono::milliseconds timeout(o.timeoutSeconds * 1000);
  std::shared_ptr<Store> store;
  ProcessGroupPtr group =
      workerGroup(o.workerDir, o.workerStrategy, rank, o.worldSize, "gloo", timeout, /*deviceIndex=*/-1, &store);
  HostLayout layout;
  if (!o.hosts.empty()) layout = parseHostLayout(o.hosts);

  torch::manual_seed(0);
  const bool gpt = o.model == "gpt";
  ModelPtr model = gpt ? buildGpt(o) : std::make_shared<UnitMlp>(o.widths);
  torch::manual_seed(1 + rank);
  const at::Tensor x = gpt ? torch::randint(0, kGptVocab, {o.batch, o.gptBlock}, torch::kLong)
                           : torch::randn({o.batch, o.widths.front()});
  const at::Tensor y = gpt ? torch::randint(0, kGptVocab, {o.batch * o.gptBlock}, torch::kLong)
                           : torch::randint(0, o.widths.back(), {o.batch}, torch::kLong);
  const int64_t classes = gpt ? kGptVocab : o.widths.back();

  StrategyContext context;
  context.model = model;
  context.optimizer = std::make_unique<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(o.lr));
  context.group = group;
  context.fsdp.backwardPrefetch = o.fsdpBackwardPrefetch;
  context.fsdp.unitBytes = static_cast<int64_t>(o.fsdpUnitMb * 1024 * 1024);
  if (o.workerStrategy == "hsdp") {
    GroupFactory groups(store, builtinBackends(), "gloo", rank, o.worldSize, group->options());
    const int shard = shardSizeOf(o);
    RankMesh mesh = groups.mesh(o.worldSize / shard, shard);
    context.group = mesh.shardGroup;
    context.replicateGroup = mesh.replicateGroup;
  }
  std::unique_ptr<ParallelStrategy> strategy = builtinStrategies().create(o.workerStrategy, std::move(context));

  std::vector<double> times;
  int64_t linkBefore = 0, linkAfter = 0;  // this host's bytes on its link around the timed steps
  for (int i = 0; i < o.warmup + o.steps; ++i) {
    if (i == o.warmup) {
      group->barrier()->wait();
      linkBefore = linkSentBytes();
    }
    const auto start = std::chrono::steady_clock::now();
    at::Tensor loss = torch::nn::functional::cross_entropy(model->forward(x).reshape({-1, classes}), y);
    strategy->backward(loss, true);
    strategy->step();
    if (i >= o.warmup) times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  group->barrier()->wait();
  linkAfter = linkSentBytes();
  // Before the checks below, which allocate full copies of the parameters.
  const double peakRss = double(peakResidentBytes());
  const ParallelStrategy::HeldBytes held = strategy->heldBytes();

  // Parameter sums, and the largest difference from rank 0's parameters.
  at::Tensor mine;
  strategy->withFullParameters([&] {
    std::vector<at::Tensor> flat;
    for (const auto& p : model->parameters()) flat.push_back(p.detach().reshape({-1}));
    mine = at::cat(flat);
  });
  at::Tensor first = mine.clone();
  group->broadcast(first)->wait();
  const double diff = (mine - first).abs().max().item<double>();

  // Per rank: median step, held bytes, peak RSS; summed into slots.
  constexpr int kFields = 7;
  at::Tensor gathered = at::zeros({o.worldSize * kFields}, at::kDouble);
  // The first rank of each simulated host counts its host's link.
  const bool countsLink = !o.hosts.empty() && rank % layout.ranksPerHost == 0;
  const double linkPerStep = countsLink ? double(linkAfter - linkBefore) / o.steps : 0.0;
  const double values[kFields] = {median(times), double(held.parameters), double(held.gradients),
                                  double(held.optimizerState), peakRss, diff, linkPerStep};
  for (int f = 0; f < kFields; ++f) gathered[rank * kFields + f] = values[f];
  group->allreduce(gathered)->wait();
  if (rank != 0) return;
  const at::Tensor table = gathered.view({o.worldSize, kFields});
  auto largest = [&](int f) { return table.select(1, f).max().item<double>(); };
  int64_t params = 0;
  std::vector<int64_t> numels;  // the trainable tensors, for the formulas
  for (const auto& [name, p] : shardableParameters(*model, "ddp-bench")) {
    params += p.numel();
    numels.push_back(p.numel());
  }
  const at::Tensor asDouble = mine.to(at::kDouble);
  writeJsonFile(resultsPath(o.workerDir, o.workerStrategy),
                json{{"impl", o.workerStrategy},
                     {"world_size", o.worldSize},
                     {"params", params},
                     {"batch_per_rank", o.batch},
                     {"step_ms", table.select(1, 0).mean().item<double>() * 1e3},
                     {"param_bytes", largest(1)},
                     {"grad_bytes", largest(2)},
                     {"optimizer_bytes", largest(3)},
                     {"peak_rss_bytes", largest(4)},
                     {"max_param_diff", largest(5)},
                     {"link_bytes_per_step", table.select(1, 6).sum().item<double>()},
                     {"hosts", o.hosts},
                     {"shard_size", o.workerStrategy == "hsdp" ? shardSizeOf(o) : 0},
                     {"model", o.model},
                     {"numels", numels},
                     {"units", fsdpUnitOf(*model, static_cast<int64_t>(o.fsdpUnitMb * 1024 * 1024))},
                     {"param_sum", asDouble.sum().item<double>()},
                     {"param_abs_sum", asDouble.abs().sum().item<double>()}});
}

std::vector<std::string> workerArguments(const Options& o, const std::string& strategy, int rank,
                                         const std::string& dir) {
  std::string widths;
  for (int64_t w : o.widths) widths += (widths.empty() ? "" : ",") + std::to_string(w);
  return {"strategies",       "--widths",          widths,
          "--model",          o.model,
          "--gpt-layers",     std::to_string(o.gptLayers),
          "--gpt-width",      std::to_string(o.gptWidth),
          "--gpt-block",      std::to_string(o.gptBlock),
          "--world-size",     std::to_string(o.worldSize),
          "--batch",          std::to_string(o.batch),
          "--steps",          std::to_string(o.steps),
          "--warmup",         std::to_string(o.warmup),
          "--lr",             fmt::format("{}", o.lr),
          "--timeout",        std::to_string(o.timeoutSeconds),
          "--fsdp-backward-prefetch", o.fsdpBackwardPrefetch ? "true" : "false",
          "--fsdp-unit-mb",   fmt::format("{}", o.fsdpUnitMb),
          "--shard-size",     std::to_string(o.shardSize),
          "--hosts",          o.hosts,
          "--worker-rank",    std::to_string(rank),
          "--worker-strategy", strategy,
          "--worker-dir",     dir};
}

double relativeDifference(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-30); }

void runLauncher(Options o) {
  if (o.plan && (!o.jsonPath.empty() || !o.plotPath.empty())) {
    fail<BenchError>("strategies --plan prints the plan and measures nothing: --json and --plot need a run. HINT: "
                     "drop --plan");
  }
  checkOutputPaths(o.jsonPath, o.plotPath);
  if (o.widths.size() < 2) fail<BenchError>("--widths: give at least two widths (inputs, classes), got {}", o.widths.size());
  for (const int64_t w : o.widths) {
    if (w < 1) fail<BenchError>("--widths: every width must be at least 1, got {}", w);
  }
  for (const int r : o.planRanks) {
    if (r < 1) fail<BenchError>("--plan-ranks: every world size must be at least 1, got {}", r);
  }
  if (!(o.lr > 0) || !std::isfinite(o.lr)) fail<BenchError>("--lr: expected a learning rate > 0, got {}", o.lr);
  if (o.plan) {
    printPlan(o);
    return;
  }
  if (o.steps < 1 || o.warmup < 0 || o.worldSize < 1 || o.batch < 1 || o.widths.size() < 2) {
    throw BenchError("--steps, --world-size and --batch must be at least 1, --warmup at least 0, --widths two or more");
  }
  for (const std::string& s : o.strategies) {
    if (!builtinStrategies().has(s)) {
      fail<BenchError>("--strategies: unknown strategy \"{}\" (known: {})", s, joinNames(builtinStrategies().names()));
    }
  }
  std::unique_ptr<SimCluster> cluster;
  HostLayout layout;
  if (!o.hosts.empty()) {
    cluster = clusterFromOptions(o.hosts, o.link, layout, std::cout);
    if (!cluster) return;  // SKIPPED, said
    o.worldSize = layout.worldSize();
    o.noReference = true;
    std::cout << "# no PyTorch reference on the simulated cluster\n";
  }
  for (const std::string& s : o.strategies) {
    if (s == "hsdp" && o.worldSize % shardSizeOf(o) != 0) {
      fail<BenchError>("--shard-size {} does not divide --world-size {}", shardSizeOf(o), o.worldSize);
    }
  }
  TempDir dir("ddp-bench-strategies-");
  ::setenv(kStoreTokenEnv, randomHex(16).c_str(), 1);
  json records = json::array();
  for (const std::string& s : o.strategies) {
    std::cerr << fmt::format("running {} on {} rank(s)...\n", s, o.worldSize);
    launchRanks(
        o.worldSize, [&](int rank) { return workerArguments(o, s, rank, dir.path()); },
        std::chrono::seconds(o.timeoutSeconds), dir.path(), s, cluster.get(), layout);
    json record = readJsonFile(resultsPath(dir.path(), s));
    if (record["max_param_diff"].get<double>() != 0) {
      fail<BenchError>("{}: after {} steps the ranks' parameters differ from rank 0's by up to {}", s,
                       o.warmup + o.steps, record["max_param_diff"].get<double>());
    }
    records.push_back(record);
  }
  if (!o.noReference) {
    if (auto why = pythonTorchUnavailable()) {
      std::cerr << "skipping the PyTorch reference: " << *why << "\n";
    } else {
      std::string widths;
      for (int64_t w : o.widths) widths += (widths.empty() ? "" : ",") + std::to_string(w);
      std::cerr << "running PyTorch's DDP, ZeroRedundancyOptimizer and FSDP...\n";
      const auto lines = runJsonLines(fmt::format(
          "{} {} --widths {} --world-size {} --batch {} --steps {} --warmup {} --lr {}{}", pythonCommandForThreads(1),
          shellQuote(std::string(DDP_SOURCE_DIR) + "/benchmarks/reference/strategies_torch.py"), widths, o.worldSize,
          o.batch, o.steps, o.warmup, o.lr, gptReferenceArguments(o)));
      for (const json& line : lines) {
        if (line.contains("unavailable")) {
          std::cout << fmt::format("{}: not run: {}\n", line.value("impl", "?"), line["unavailable"].get<std::string>());
          continue;
        }
        records.push_back(line);
      }
    }
  }

  std::vector<std::string> columns = {"impl", "ranks", "params", "step_ms", "param_MiB", "grad_MiB", "optim_MiB",
                                     "peak_rss_MiB", "params_vs_ddp"};
  if (cluster) columns.push_back("link_MiB_per_step");
  Table table(columns, 1);
  const json* ddpRecord = nullptr;
  for (const auto& r : records)
    if (r["impl"] == "ddp") ddpRecord = &r;
  auto mib = [](const json& v) { return formatFixed(v.get<double>() / (1024.0 * 1024.0), 1); };
  bool agree = true;
  for (const auto& r : records) {
    std::string match = "-";
    if (ddpRecord && r.contains("param_sum")) {
      const double d = std::max(relativeDifference(r["param_sum"], (*ddpRecord)["param_sum"]),
                                relativeDifference(r["param_abs_sum"], (*ddpRecord)["param_abs_sum"]));
      match = fmt::format("{:.1e}", d);
      if (d > 1e-4 && r["impl"].get<std::string>().rfind("torch-", 0) != 0) agree = false;
    }
    std::vector<std::string> row = {r["impl"].get<std::string>(), std::to_string(r["world_size"].get<int>()),
                                    std::to_string(r["params"].get<int64_t>()), formatFixed(r["step_ms"].get<double>(), 1),
                                    mib(r["param_bytes"]), mib(r["grad_bytes"]), mib(r["optimizer_bytes"]),
                                    mib(r["peak_rss_bytes"]), match};
    if (cluster) row.push_back(mib(r["link_bytes_per_step"]));
    table.addRow(row);
  }
  std::cout << table.render();
  if (ddpRecord) {
    const double ddpStep = (*ddpRecord)["step_ms"], ddpOptim = (*ddpRecord)["optimizer_bytes"];
    for (const auto& r : records) {
      if (r["impl"] == "ddp") continue;
      std::cout << fmt::format("{} / ddp: step {:.2f}x, optimizer state {:.2f}x, gradients {:.2f}x, peak RSS {:.2f}x\n",
                               r["impl"].get<std::string>(), r["step_ms"].get<double>() / ddpStep,
                               r["optimizer_bytes"].get<double>() / ddpOptim,
                               r["grad_bytes"].get<double>() / (*ddpRecord)["grad_bytes"].get<double>(),
                               r["peak_rss_bytes"].get<double>() / (*ddpRecord)["peak_rss_bytes"].get<double>());
    }
  }
  // The formulas against what the strategies reported.
  bool formulasHold = true;
  for (const auto& r : records) {
    const std::string impl = r["impl"];
    if (impl.rfind("torch-", 0) == 0) continue;
    // hsdp holds what fsdp holds over one row, and also sends its gradient
    // shard around its column (a ring allreduce: 2 (R-1)/R of it).
    StrategyFootprint f =
        strategyFootprint(impl == "hsdp" ? "fsdp" : impl, r["numels"].get<std::vector<int64_t>>(),
                          impl == "hsdp" ? r["shard_size"].get<int>() : o.worldSize, 4, 2, DdpOptions{}.bucketCapBytes,
                          r["units"].get<std::vector<int>>());
    if (impl == "hsdp") {
      const int64_t replicas = o.worldSize / r["shard_size"].get<int>();
      f.sentBytesPerStep += 2 * (replicas - 1) * f.gradientBytes / replicas;
    }
    const bool same = f.parameterBytes == r["param_bytes"].get<double>() &&
                      f.gradientBytes == r["grad_bytes"].get<double>() &&
                      f.optimizerBytes == r["optimizer_bytes"].get<double>();
    formulasHold = formulasHold && same;
    std::cout << fmt::format("{}: formula {} / {} / {} bytes (params / grads / optimizer), sends {} per step: {}\n",
                             impl, f.parameterBytes, f.gradientBytes, f.optimizerBytes, f.sentBytesPerStep,
                             same ? "as measured" : "DIFFERS from the measurement");
  }
  const json *zero1 = nullptr, *torchZero = nullptr;
  for (const auto& r : records) {
    if (r["impl"] == "zero1") zero1 = &r;
    if (r["impl"] == "torch-zero") torchZero = &r;
  }
  if (zero1 && torchZero) {
    std::cout << fmt::format("zero1 / torch-zero (ZeroRedundancyOptimizer) step time: {:.2f}x (target <= 0.8)\n",
                             (*zero1)["step_ms"].get<double>() / (*torchZero)["step_ms"].get<double>());
  }
  writeRecords(o.jsonPath, o.plotPath, records);
  if (!agree) throw BenchError("a strategy ended with other parameters than ddp (params_vs_ddp above 1e-4)");
  if (!formulasHold) throw BenchError("strategyFootprint does not match what a strategy holds (see above)");
}

}  // namespace strategies

void registerStrategiesCommand(CLI::App& app) {
  using namespace strategies;
  auto options = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "strategies", "Step time and memory of each parallel strategy vs PyTorch's DDP, ZeRO and FSDP, same run");
  cmd->add_flag("--plan", options->plan,
                "Instead: print each strategy's memory per rank and bytes sent per step for a 7B model, no runs");
  cmd->add_option("--plan-ranks", options->planRanks, "World sizes of --plan")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--strategies", options->strategies, "Comma-separated strategies")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--widths", options->widths, "MLP layer widths (Adam, cross entropy over the last)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--world-size", options->worldSize, "Ranks (processes)")->capture_default_str();
  cmd->add_option("--batch", options->batch, "Samples per rank")->capture_default_str();
  cmd->add_option("--steps", options->steps, "Timed steps (the median is reported)")->capture_default_str();
  cmd->add_option("--warmup", options->warmup, "Untimed steps first")->capture_default_str();
  cmd->add_option("--lr", options->lr, "Adam's learning rate")->capture_default_str();
  cmd->add_flag("--no-reference", options->noReference, "Do not run PyTorch");
  cmd->add_option("--json", options->jsonPath, "Also write the records to this JSON file");
  cmd->add_option("--plot", options->plotPath, "Also draw step time and memory per strategy into this PNG (scripts/ddp-plot)");
  cmd->add_option("--model", options->model, "mlp (of --widths) or gpt (of --gpt-layers, --gpt-width, --gpt-block)")
      ->check(CLI::IsMember({"mlp", "gpt"}))
      ->capture_default_str();
  cmd->add_option("--gpt-layers", options->gptLayers, "gpt: blocks")->capture_default_str();
  cmd->add_option("--gpt-width", options->gptWidth, "gpt: n_embd (heads of 64)")->capture_default_str();
  cmd->add_option("--gpt-block", options->gptBlock, "gpt: tokens per sample")->capture_default_str();
  cmd->add_option("--fsdp-unit-mb", options->fsdpUnitMb,
                  "fsdp: join consecutive units until each holds this many MiB (distributed.fsdp_unit_mb)")
      ->capture_default_str();
  cmd->add_option("--fsdp-backward-prefetch", options->fsdpBackwardPrefetch,
                  "fsdp: gather the next unit for backward while one computes (distributed.fsdp_backward_prefetch)")
      ->capture_default_str();
  cmd->add_option("--timeout", options->timeoutSeconds, "Seconds all ranks of one strategy may take")
      ->capture_default_str();
  cmd->add_option("--shard-size", options->shardSize,
                  "hsdp: ranks per row of the mesh (0: the ranks of one --hosts host, else half the ranks)")
      ->capture_default_str();
  cmd->add_option("--hosts", options->hosts,
                  "Run on a simulated cluster of HOSTSxRANKS (e.g. 2x2; needs root): network namespaces joined by "
                  "shaped links; adds the bytes each step puts on the links")
      ->capture_default_str();
  cmd->add_option("--link", options->link, "The simulated cluster's links: 10gbit, 1gbit or none")
      ->capture_default_str();
  cmd->add_option("--worker-rank", options->workerRank)->group("");
  cmd->add_option("--worker-strategy", options->workerStrategy)->group("");
  cmd->add_option("--worker-dir", options->workerDir)->group("");
  cmd->callback([options] {
    runWorkerOrLauncher(
        "strategies", options->workerRank, options->workerDir, options->workerRank >= 0 ? options->workerStrategy : "",
        [&] { runWorker(*options); }, [&] { runLauncher(*options); });
  });
}

}  // namespace ddp::bench
