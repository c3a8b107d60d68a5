// ddp-run: runs an experiment. As a launcher (--nproc-per-node N, or the
// experiment's distributed.nproc_per_node) it validates the experiment and
// its command line and spawns this node's ranks; as a rank (started by
// ddp-run, torchrun, srun or mpirun) it joins the group and trains, rank 0
// creating the run folder.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <torch/version.h>
#include <torch/cuda.h>
#include <unistd.h>
#include <sys/stat.h>
#include <ctime>
#include <iostream>
#include <optional>
#include <sstream>
#include <thread>

#include "apps/ddp_run.hpp"
#include "apps/export_weights.hpp"
#include "apps/sample.hpp"
#include "ddp/config.hpp"
#include "framework/core/system.hpp"
#include "plugins/builtin.hpp"
#include "backends/builtin.hpp"
#include "framework/comm/backend_registry.hpp"
#include "framework/launch/distributed.hpp"
#include "framework/store/etcd_store.hpp"
#include "framework/core/malloc_tuning.hpp"
#include "framework/core/compute_threads.hpp"
#include "framework/core/errors.hpp"
#include "framework/core/log.hpp"
#include "framework/experiment/experiment_config.hpp"
#include "framework/launch/elastic_error_file.hpp"
#include "framework/launch/elastic.hpp"
#include "framework/launch/launcher.hpp"
#include "framework/experiment/plugin_registry.hpp"
#include "framework/launch/rank_env.hpp"
#include "framework/launch/spawn.hpp"
#include "framework/experiment/trainer.hpp"

namespace {

struct Args {
  std::string experiment;
  std::vector<std::string> overrides;
  std::string outDir;
  bool resume = false;
  bool listPlugins = false;
  bool schema = false;
  std::vector<std::string> pluginLibs;  // --plugin-lib: for --list-plugins, --describe and --schema
  std::string describe;
  int nprocPerNode = 0;
  int nnodes = 1;
  int nodeRank = 0;
  std::string masterAddr = "127.0.0.1";
  int masterPort = 0;
  int maxRestarts = 0;
  int minRanks = 0;  // --min-ranks: elastic (launch/elastic.hpp)
  double killGrace = 3.0;
  bool standalone = false;
  std::string logDir;
  bool tee = false;
  std::string localRanksFilterText;
  std::vector<int> localRanksFilter;
  std::string rdzvEndpoint;
  std::string rdzvBackend = "static";
  std::string rdzvId;
  std::string storeUrl;  // --rdzv-backend etcd: etcd://HOST:PORT[,...]/ddp/<rdzv-id>
  bool demo = false;
  bool version = false;
  std::string demoBackend = "gloo";
  ddp::apps::SampleOptions sample;
  ddp::apps::ExportOptions exportWeights;
};

void shareCoresAmongHostRanks(const ddp::RankEnv& env, int ranksOnHost);

// --log-dir, --tee and --local-ranks-filter into the launcher's options;
// the folder is made here, before any rank starts.
void applyLogOptions(const Args& args, int nproc, ddp::LaunchOptions& lo) {
  for (int r : args.localRanksFilter) {
    if (r >= nproc) {
      ddp::fail<ddp::UsageError>("ddp-run: --local-ranks-filter: local rank {} does not exist ({} rank(s) per node: "
                                 "0..{})",
                                 r, nproc, nproc - 1);
    }
  }
  lo.consoleLocalRanks = args.localRanksFilter;
  lo.tee = args.tee;
  if (!args.logDir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(args.logDir, ec);
    if (ec || !std::filesystem::is_directory(args.logDir)) {
      ddp::fail<ddp::UsageError>("ddp-run: --log-dir {}: cannot create the folder: {}", args.logDir,
                                 ec ? ec.message() : "it is not a folder");
    }
    lo.logDir = std::filesystem::absolute(args.logDir).string();
  }
}

// The collective demo: allreduce, broadcast and allgather with checked results.
int runDemo(const ddp::RankEnv& env, const std::string& backend) {
  ddp::DistributedOptions dopts;
  dopts.backend = backend;
  dopts.timeout = std::chrono::milliseconds(60000);
  auto ctx = ddp::initDistributed(env, dopts, ddp::builtinBackends());
  shareCoresAmongHostRanks(env, ctx.ranksOnHost);
  auto& pg = *ctx.group;
  const int n = pg.size(), r = pg.rank();
  at::Tensor t = at::full({1 << 20}, float(r + 1));
  pg.allreduce(t)->wait();
  const float expected = n * (n + 1) / 2.0f;
  bool ok = at::all(t == expected).item<bool>();
  at::Tensor b = at::full({4}, float(r));
  pg.broadcast(b, {0})->wait();
  ok = ok && at::all(b == 0.0f).item<bool>();
  at::Tensor g = at::empty({n});
  pg.allgather(at::full({1}, float(r)), g)->wait();
  ok = ok && at::equal(g, at::arange(n).to(at::kFloat));
  pg.barrier()->wait();
  std::cout << fmt::format("rank {}/{} ({}, from {}): allreduce sum = {} (expected {}); broadcast, allgather {}", r, n,
                           pg.backendName(), env.source, t[0].item<float>(), expected, ok ? "correct" : "WRONG")
            << std::endl;
  return ok ? 0 : 1;
}

// The default run folder, runs/<name>-<time>, made here (mkdir is atomic)
// so that two runs started in the same second, by one launcher or two, get
// two folders: the second takes runs/<name>-<time>-2, and so on. A folder
// made here and still empty when ddp-run ends (a mistake stopped the run
// before it wrote anything) is removed again (ReservedRunDir).
std::string gReservedRunDir;
struct ReservedRunDir {
  ~ReservedRunDir() {
    if (!gReservedRunDir.empty()) ::rmdir(gReservedRunDir.c_str());
  }
};

std::string defaultRunDir(const ddp::ExperimentConfig& config) {
  char stamp[32];
  std::time_t now = std::time(nullptr);
  std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", std::localtime(&now));
  std::string name = config.name.empty() ? "run" : config.name;
  const std::string base = fmt::format("runs/{}-{}", name, stamp);
  std::error_code ec;
  std::filesystem::create_directories("runs", ec);
  for (int k = 1; k < 10000; ++k) {
    const std::string dir = k == 1 ? base : fmt::format("{}-{}", base, k);
    if (::mkdir(dir.c_str(), 0755) == 0) {
      gReservedRunDir = dir;
      return dir;
    }
    if (errno != EEXIST) {
      throw ddp::UsageError(fmt::format("cannot create run folder {}: {}. HINT: --out a folder you can write",
                                        dir, ddp::errnoText(errno)));
    }
  }
  throw ddp::UsageError(fmt::format("runs/: no free name after {}-9999. HINT: --out a folder", base));
}

// What ran, in the run's config.json: the ranks per node and the nodes
// (--nproc-per-node and --nnodes, or the launcher's environment), so that
// `ddp-run RUN/config.json` trains on the same world.
void recordWorld(std::vector<std::string>& overrides, int nprocPerNode, int nnodes) {
  overrides.push_back(fmt::format("distributed.nproc_per_node={}", nprocPerNode));
  overrides.push_back(fmt::format("distributed.nnodes={}", nnodes));
}

// A restart by a launcher or scheduler (ddp-run --max-restarts, torchrun
// --max-restarts, a requeued SLURM job) continues from the newest checkpoint.
bool isRestart() { return ddp::restartedByAnyLauncher(ddp::currentEnvironment()); }

// Before any rank starts: a backend this build or machine cannot run (NCCL
// without GPUs) would otherwise fail in every rank.
void checkBackendUsable(const std::string& where, const std::string& backend) {
  if (auto why = ddp::builtinBackends().whyUnusable(backend)) ddp::fail<ddp::UsageError>("{}: {}", where, *why);
}

// ddp-run sets OMP_NUM_THREADS to cores / its own ranks. Launchers started
// by hand for several nodes on one host each do so, oversubscribing it: once
// the ranks have met, threads are shared among all ranks on the host.
void shareCoresAmongHostRanks(const ddp::RankEnv& env, int ranksOnHost) {
  const char* automatic = std::getenv("DDP_RUN_THREADS_AUTO");
  if (automatic == nullptr || std::string(automatic) != "1" || ranksOnHost <= env.localWorldSize) return;
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const int threads = static_cast<int>(std::max(1u, cores / static_cast<unsigned>(ranksOnHost)));
  ddp::setComputeThreads(threads);
  if (env.localRank == 0) {
    std::cerr << fmt::format("ddp-run: {} ranks of this job share this host ({} cores), more than this launcher's {}; "
                             "{} thread(s) per rank\n",
                             ranksOnHost, cores, env.localWorldSize, threads)
              << std::flush;
  }
}

// `loaded`: the experiment as the launcher already read it (one process
// runs); read it here otherwise.
// A rank started by srun, mpirun or torchrun, one ddp-run per rank:
// --min-ranks and --rdzv-backend etcd apply to it as ddp-run's launcher
// would have set them (DDP_MIN_RANKS, DDP_STORE_URL; the environment's own
// values give way to the command line's). Under torchrun on one node,
// in-place recovery cannot work and is refused: its agent stops every
// worker of the node as soon as one fails; so is mpirun without
// --enable-recovery, which aborts every rank at the first death.
void applyElasticOptions(const Args& args, const ddp::RankEnv& env) {
  if (args.minRanks > 0) ::setenv("DDP_MIN_RANKS", std::to_string(args.minRanks).c_str(), 1);
  if (!args.storeUrl.empty()) ::setenv("DDP_STORE_URL", args.storeUrl.c_str(), 1);
  const int minRanks = ddp::elasticMinRanks();
  if (minRanks <= 0) return;
  if (minRanks > env.worldSize) {
    throw ddp::UsageError(fmt::format("--min-ranks {} is more than the job's {} ranks ({}). HINT: --min-ranks {}",
                                      minRanks, env.worldSize, env.source, env.worldSize));
  }
  // OpenMPI 4 passes `mpirun --enable-recovery` on to its ranks as this
  // variable; without it, mpirun aborts every rank as soon as one dies.
  const char* recovery = std::getenv("OMPI_MCA_orte_enable_recovery");
  const bool recovers = recovery != nullptr && (std::string(recovery) == "1" || std::string(recovery) == "true");
  if (env.source == "openmpi" && !recovers) {
    throw ddp::UsageError(fmt::format(
        "--min-ranks {} under mpirun without --enable-recovery: mpirun ends every rank as soon as one dies, so no "
        "rank is left to carry on in place. HINT: mpirun --enable-recovery ... ddp-run --min-ranks {} (OpenMPI 4), "
        "or ddp-run --nproc-per-node N --min-ranks {} (its own launcher keeps the others)",
        minRanks, minRanks, minRanks));
  }
  if (env.source == "torchrun" && env.localWorldSize >= env.worldSize) {
    throw ddp::UsageError(fmt::format(
        "--min-ranks {} under torchrun on one node: torchrun's agent stops every worker of a node as soon as one "
        "fails, so no rank is left to carry on in place. HINT: ddp-run --nproc-per-node {} --min-ranks {} (ddp-run's "
        "launcher keeps the others), or torchrun --max-restarts N without --min-ranks",
        minRanks, env.worldSize, minRanks));
  }
}

int runRank(const Args& args, const ddp::RankEnv& env, std::optional<ddp::ExperimentConfig> loaded = std::nullopt) {
  // Before the first tensor of training. Only a process that trains: the
  // launcher, --export and --sample keep glibc's settings (the export
  // streams tensor by tensor; kept freed blocks would add up there).
  const ddp::MallocTuning malloc = ddp::tuneMallocForTensors();
  if (malloc.applied) {
    ddp::logInfo("malloc: mmap threshold {} MiB, trim threshold {} MiB (DDP_MALLOC_TUNING=0 keeps glibc's)",
                 malloc.mmapThreshold >> 20, malloc.trimThreshold >> 20);
  } else {
    ddp::logInfo("malloc: left as it is: {}", malloc.reason);
  }
  auto& registry = ddp::builtinPlugins();
  const ReservedRunDir removeIfUnused;
  if (env.source != "ddp-run" && env.source != "single") applyElasticOptions(args, env);
  std::vector<std::string> overrides = args.overrides;
  if (!loaded && env.worldSize > 0) {
    const int local = std::max(1, env.localWorldSize);
    recordWorld(overrides, local, std::max(1, env.worldSize / local));
  }
  ddp::ExperimentConfig config =
      loaded ? std::move(*loaded) : ddp::loadExperimentConfig(args.experiment, overrides, registry);
  // Ranks started by srun, mpirun or torchrun say who they think they are,
  // before the rendezvous, so a job that never meets shows why.
  if (env.source != "ddp-run" && env.source != "single") {
    const char* url = std::getenv("DDP_STORE_URL");
    std::cerr << fmt::format("ddp-run: {}\n", ddp::describeRankEnv(env, url != nullptr ? url : ""))
              << std::flush;  // one write: ranks share a terminal
  }
  ddp::DistributedOptions dopts;
  dopts.backend = config.distributed.backend;
  dopts.timeout = std::chrono::milliseconds(static_cast<int64_t>(config.distributed.timeoutSeconds * 1000));
  auto ctx = ddp::initDistributed(env, dopts, ddp::builtinBackends());
  shareCoresAmongHostRanks(env, ctx.ranksOnHost);

  // Rank 0 names the run folder; the others learn it through the store, so
  // ranks started by srun or mpirun agree without a shared clock. Training
  // creates it, once the experiment's plugins are built.
  const bool joiner = ddp::elasticJoiner();
  const bool resume = !joiner && (args.resume || isRestart());
  std::string runDir = args.outDir;
  if (env.rank == 0 && !joiner) {
    if (runDir.empty()) runDir = defaultRunDir(config);
    if (!resume) ddp::checkRunFolderIsFree(runDir);
    ctx.store->setString("ddp-run/run_dir", runDir);
  } else {
    runDir = ctx.store->getString("ddp-run/run_dir");
  }
  ddp::RunOptions ro;
  ro.runDir = runDir;
  ro.resume = resume;
  ro.restart = !args.resume;
  ro.minRanks = ddp::elasticMinRanks();
  ro.elasticJoin = joiner;
  if (ro.minRanks > 0 && config.distributed.strategy != "ddp") {
    throw ddp::UsageError(fmt::format(
        "--min-ranks: distributed.strategy {} cannot recover in place (its optimizer state is sharded). HINT: "
        "--set distributed.strategy=ddp, or --max-restarts without --min-ranks",
        config.distributed.strategy));
  }
  auto result = ddp::runTraining(config, ctx, ro, registry);
  if (result.group && result.group->rank() == 0 && !result.history.empty() && result.signal == 0) {
    const auto& last = result.history.back();
    std::cout << "done: " << result.steps << " steps; final train_loss " << last.trainLoss;
    if (last.testAccuracy) std::cout << ", test_accuracy " << *last.testAccuracy;
    if (last.testRmse) std::cout << ", test_rmse " << *last.testRmse;
    std::cout << "; run folder " << runDir << std::endl;
  }
  if (result.group) result.group->barrier()->wait();
  // Stopped by SIGTERM or SIGINT after a checkpoint (training.checkpoint_on_signal).
  return result.signal != 0 ? 128 + result.signal : 0;
}

int runMain(int argc, char** argv);

// A rank started by this node's launcher as a copy of it (no exec:
// launcher.hpp's workerEntry). What main() would have found had the rank
// been loaded afresh: the rank's own thread count (OMP_NUM_THREADS, read by
// OpenMP when the launcher was loaded) and no run folder reserved.
int rankInLaunchersCopy(const std::vector<std::string>& argv) {
  gReservedRunDir.clear();
  if (const char* threads = std::getenv("OMP_NUM_THREADS")) {
    const int n = std::atoi(threads);
    if (n > 0) ddp::setComputeThreads(n);
  }
  return ddp::callMain(runMain, argv);
}

}  // namespace

int ddpRunMain(int argc, char** argv) { return runMain(argc, argv); }

namespace {

int runMain(int argc, char** argv) {
  // A mistake in the environment, like one on the command line: one line,
  // exit code 2, before anything starts.
  try {
    ddp::checkLogLevel();
  } catch (const ddp::UsageError& e) {
    std::cerr << "ddp-run: " << e.what() << std::endl;
    return 2;
  }
  // OpenBLAS's own pool follows ATen's count (OMP_NUM_THREADS, which the
  // launcher, torchrun or SLURM set per rank), unless the user sized it.
  if (std::getenv("OPENBLAS_NUM_THREADS") == nullptr) ddp::setComputeThreads(at::get_num_threads());
  CLI::App app{"ddp-run: train an experiment on one process, every core of a machine, or a cluster"};
  Args args;
  app.add_option("experiment", args.experiment, "experiment JSON file");
  app.add_option("--set", args.overrides, "override a setting, e.g. --set optimizer.lr=0.01 (repeatable)");
  app.add_option("--out", args.outDir, "run folder (default: runs/<name>-<time>)");
  app.add_flag("--resume", args.resume, "continue from the newest checkpoint in --out");
  app.add_flag("--version", args.version,
               "print ddp's version, the plugin API version, LibTorch's version and the backends built in");
  app.add_flag("--list-plugins", args.listPlugins, "list the plugins: datasets, models, optimizers, schedulers, losses and communication hooks");
  app.add_option("--describe", args.describe,
                 "describe one plugin's parameters (e.g. optimizer.adam), or a section: training, distributed, plugins");
  app.add_flag("--schema", args.schema,
               "print a JSON Schema of the experiment format (for editors: \"$schema\" in an experiment names it)");
  app.add_option("--plugin-lib", args.pluginLibs,
                 "load a plugin library first, for --list-plugins, --describe and --schema (repeatable; an "
                 "experiment loads its own from its \"plugins\" key)")
      ->allow_extra_args(false);  // one path per --plugin-lib: the experiment stays positional
  app.add_option("--nproc-per-node,--nproc_per_node", args.nprocPerNode, "ranks to start on this node (launcher mode)")
      ->check(CLI::Range(1, 4096));
  app.add_option("--nnodes", args.nnodes, "number of nodes in the job")->check(CLI::Range(1, 1 << 20));
  app.add_option("--node-rank,--node_rank", args.nodeRank, "this node's index, 0 on the master")->check(CLI::Range(0, 1 << 20));
  app.add_option("--master-addr,--master_addr", args.masterAddr, "address of the node with --node-rank 0 (default: MASTER_ADDR)");
  app.add_option("--master-port,--master_port", args.masterPort,
                 "port of the rendezvous store (default: MASTER_PORT; 0: pick a free one)")
      ->check(CLI::Range(0, 65535));
  app.add_option("--min-ranks,--min_ranks", args.minRanks,
                 "elastic: keep training when ranks are lost, as long as this many remain; the others carry on "
                 "from their memory and a restarted rank (--max-restarts) rejoins (distributed.strategy ddp)");
  app.add_option("--max-restarts,--max_restarts", args.maxRestarts, "restart all ranks up to this many times after a failure")
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("--log-dir,--log_dir", args.logDir,
                 "also write each rank's output to DIR/rank_<rank>.log (created if missing); the console then shows "
                 "local rank 0 only, unless --tee or --local-ranks-filter");
  app.add_flag("--tee", args.tee, "print every rank's output, each line with its [rank r] prefix (rank 0's too)");
  // A string, split below: a list option would swallow the experiment after it.
  app.add_option("--local-ranks-filter,--local_ranks_filter", args.localRanksFilterText,
                 "comma-separated local ranks whose output reaches the console, e.g. 0,1");
  // torchrun's spellings, so that a command line from a PyTorch tutorial
  // works with ddp-run in torchrun's place.
  app.add_flag("--standalone", args.standalone,
               "one node, a free port for the store (as torchrun --standalone; ddp-run's default for one node)");
  app.add_option("--rdzv-endpoint,--rdzv_endpoint", args.rdzvEndpoint,
                 "HOST[:PORT] of the store (as torchrun; the same as --master-addr HOST --master-port PORT, port "
                 "29400 if not given)");
  app.add_option("--rdzv-backend,--rdzv_backend", args.rdzvBackend,
                 "static or c10d (as torchrun): either way the store runs on the endpoint's node, node ranks from "
                 "--node-rank; etcd: the store is etcd at --rdzv-endpoint HOST:PORT[,HOST:PORT...] (its client "
                 "URLs), under --rdzv-id, and outlives any training host")
      ->check(CLI::IsMember({"static", "c10d", "etcd"}));
  app.add_option("--rdzv-id,--rdzv_id", args.rdzvId,
                 "the job's name in the store: needed with --rdzv-backend etcd (its keys live under /ddp/<id>; under "
                 "SLURM slurm-$SLURM_JOB_ID by default), the "
                 "same on every node, new for each job (e.g. $SLURM_JOB_ID); otherwise accepted for torchrun's "
                 "command lines and not used");
  app.add_option("--kill-grace", args.killGrace,
                 "seconds ranks get to exit, before SIGKILL, after SIGTERM (a rank failed) or after the SIGINT, "
                 "SIGTERM or SIGHUP that the launcher received and passed on; after such a signal ddp-run exits "
                 "with 128 + its number and does not restart (default 3)")
      ->check(CLI::Range(0.0, 3600.0));
  app.add_option("--sample", args.sample.runDir,
                 "print text from the language model trained in RUN_DIR (see --prompt, --tokens, --temperature, "
                 "--top-k, --seed)");
  app.add_option("--prompt", args.sample.prompt, "with --sample: the text to continue (default: a line break)");
  app.add_option("--checkpoint", args.sample.checkpoint,
                 "with --sample or --export: latest (default), best (the best of training.keep_best) or a checkpoint "
                 "file");
  app.add_option("--export", args.exportWeights.runDir,
                 "write the weights of the model trained in RUN_DIR for PyTorch: --format safetensors (default) or "
                 "torch (torch.load reads it as a dict), -o FILE (default RUN_DIR/model.safetensors or model.pt)");
  app.add_option("--format", args.exportWeights.format, "with --export: safetensors (default) or torch")
      ->check(CLI::IsMember({"safetensors", "torch"}));
  app.add_option("-o,--output", args.exportWeights.output, "with --export: the file to write");
  app.add_option("--tokens", args.sample.tokens, "with --sample: tokens to generate (default 200)");
  app.add_option("--temperature", args.sample.temperature,
                 "with --sample: divides the logits; 0 takes the most likely token (default 1)");
  app.add_option("--top-k", args.sample.topK, "with --sample: draw among the k most likely tokens (default 0: all)");
  app.add_option("--seed", args.sample.seed, "with --sample: seeds the draws (default 0)")
      ->check(CLI::Validator(
          [](std::string& value) -> std::string {
            const bool digits = !value.empty() && value.size() <= 19 &&
                                std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; });
            if (digits && (value.size() < 19 || value <= "9223372036854775807")) return "";
            return fmt::format("expected a whole number from 0 to 9223372036854775807, got '{}'", value);
          },
          "SEED"));
  app.add_flag("--demo", args.demo, "run a collective demo instead of an experiment");
  app.add_option("--demo-backend", args.demoBackend, "backend of the collective demo (gloo, nccl)");
  app.footer(
      "Timeouts: a collective or rendezvous that waits longer than distributed.timeout_s (default 300 s) fails, "
      "naming what it waited for; reaching the master retries for 60 s. While ranks wait for each other, a line "
      "every 10 s says which have arrived. Several nodes need --master-addr (or MASTER_ADDR), --master-port and, "
      "for a store only the job can use, DDP_STORE_TOKEN (docs/clusters.md).");
  try {
    app.parse(argc, argv);
    if (app.count("--local-ranks-filter") > 0) {
      std::stringstream words(args.localRanksFilterText);
      std::string word;
      while (std::getline(words, word, ',')) {
        char* end = nullptr;
        const long r = std::strtol(word.c_str(), &end, 10);
        if (word.empty() || *end != '\0' || r < 0 || r > 4095) {
          throw CLI::ValidationError("--local-ranks-filter",
                                     fmt::format("'{}': expected local ranks like 0,1", args.localRanksFilterText));
        }
        args.localRanksFilter.push_back(static_cast<int>(r));
      }
      if (args.localRanksFilter.empty()) {
        throw CLI::ValidationError("--local-ranks-filter", "names no rank; expected local ranks like 0,1");
      }
    }
    if (args.standalone && (args.nnodes > 1 || !args.rdzvEndpoint.empty() || app.count("--master-addr") > 0)) {
      throw CLI::ValidationError("--standalone",
                                 "is one node with a store on a free port; it excludes --nnodes > 1, --rdzv-endpoint "
                                 "and --master-addr");
    }
    if (args.rdzvBackend == "etcd") {
      // The store is etcd: HOST[:PORT] of one or more of its members.
      if (args.rdzvEndpoint.empty()) {
        throw CLI::ValidationError("--rdzv-backend etcd",
                                   "needs --rdzv-endpoint HOST:PORT (etcd's client URL; several, comma-separated, for "
                                   "an etcd cluster)");
      }
      // Under SLURM the job's id names it, the same in every task and new
      // for each job (an sbatch line cannot name the id before it exists).
      if (const char* job = std::getenv("SLURM_JOB_ID"); args.rdzvId.empty() && job != nullptr && *job != '\0') {
        // A requeued job starts afresh: its own keys, not the last run's.
        const char* requeue = std::getenv("SLURM_RESTART_COUNT");
        args.rdzvId = requeue != nullptr && *requeue != '\0' && std::string(requeue) != "0"
                          ? fmt::format("slurm-{}-{}", job, requeue)
                          : fmt::format("slurm-{}", job);
      }
      if (args.rdzvId.empty()) {
        throw CLI::ValidationError("--rdzv-backend etcd",
                                   "needs --rdzv-id: the job's name in etcd, the same on every node and new for each "
                                   "job (e.g. --rdzv-id $SLURM_JOB_ID)");
      }
      if (args.rdzvId.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") !=
          std::string::npos) {
        throw CLI::ValidationError("--rdzv-id", fmt::format("'{}': use letters, digits, '.', '_' and '-'", args.rdzvId));
      }
      if (app.count("--master-addr") > 0 || app.count("--master-port") > 0 || args.standalone) {
        throw CLI::ValidationError("--rdzv-backend etcd",
                                   "names the store already; drop --master-addr / --master-port / --standalone");
      }
      std::string endpoints;
      for (size_t start = 0; start <= args.rdzvEndpoint.size();) {
        const size_t comma = std::min(args.rdzvEndpoint.find(',', start), args.rdzvEndpoint.size());
        std::string one = args.rdzvEndpoint.substr(start, comma - start);
        const size_t colon = one.rfind(':');
        if (colon == std::string::npos || one.find(']', colon) != std::string::npos) one += ":2379";
        endpoints += (endpoints.empty() ? "" : ",") + one;
        start = comma + 1;
      }
      ddp::EtcdStoreOptions eo;
      try {
        ddp::parseEtcdUrl(fmt::format("etcd://{}/ddp/{}", endpoints, args.rdzvId), &eo);
      } catch (const ddp::UsageError& e) {
        throw CLI::ValidationError("--rdzv-endpoint", e.what());
      }
      args.storeUrl = ddp::formatEtcdUrl(eo);
      // MASTER_ADDR: the ranks pick the interface that reaches it.
      const std::string& first = eo.endpoints.front();
      std::string host = first.substr(0, first.rfind(':'));
      if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
      args.masterAddr = host;
      args.masterPort = std::atoi(first.c_str() + first.rfind(':') + 1);
    } else if (!args.rdzvEndpoint.empty()) {
      if (app.count("--master-addr") > 0 || app.count("--master-port") > 0) {
        throw CLI::ValidationError("--rdzv-endpoint", "names the store already; drop --master-addr / --master-port");
      }
      const size_t colon = args.rdzvEndpoint.rfind(':');
      const bool hasPort = colon != std::string::npos && args.rdzvEndpoint.find(']', colon) == std::string::npos;
      std::string host = hasPort ? args.rdzvEndpoint.substr(0, colon) : args.rdzvEndpoint;
      if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
      int port = 29400;
      if (hasPort) {
        const std::string text = args.rdzvEndpoint.substr(colon + 1);
        char* end = nullptr;
        const long value = std::strtol(text.c_str(), &end, 10);
        if (text.empty() || *end != '\0' || value < 0 || value > 65535) {
          throw CLI::ValidationError("--rdzv-endpoint",
                                     fmt::format("'{}': expected HOST[:PORT] with a port 0-65535 (0: a free one)", args.rdzvEndpoint));
        }
        port = static_cast<int>(value);
      }
      if (host.empty()) throw CLI::ValidationError("--rdzv-endpoint", "names no host");
      args.masterAddr = host;
      args.masterPort = port;
    }
    if (args.nodeRank >= args.nnodes) {
      throw CLI::ValidationError("--node-rank", fmt::format("{} is not below --nnodes {}", args.nodeRank, args.nnodes));
    }
    // As a launcher, MASTER_PORT (and, for several nodes, MASTER_ADDR) give
    // the defaults; a rank reads them itself, from its environment. One node
    // keeps 127.0.0.1: an inherited MASTER_ADDR may name another host.
    if (app.count("--master-addr") == 0 && args.rdzvEndpoint.empty() && args.nnodes > 1) {
      const char* addr = std::getenv("MASTER_ADDR");
      if (addr == nullptr || *addr == '\0') {
        // 127.0.0.1 on every node would have each node wait for itself.
        std::cerr << fmt::format("ddp-run: --nnodes {} needs --master-addr: the address of the node with --node-rank 0, "
                                 "as the other nodes reach it. HINT: pass --master-addr <host of node 0> (or export "
                                 "MASTER_ADDR) on every node",
                                 args.nnodes)
                  << std::endl;
        return 2;
      }
      args.masterAddr = addr;
    }
    if (const char* port = std::getenv("MASTER_PORT");
        port && *port && app.count("--master-port") == 0 && args.rdzvEndpoint.empty() && !args.standalone) {
      char* end = nullptr;
      const long value = std::strtol(port, &end, 10);
      if (*end != '\0' || value < 0 || value > 65535) {
        throw CLI::ValidationError("MASTER_PORT",
                                   fmt::format("'{}' is not a port (0-65535); it is the default of --master-port", port));
      }
      args.masterPort = static_cast<int>(value);
    }
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // One line and exit code 2, like every other mistake in what was asked.
    std::string what = e.what();
    for (char& c : what) {
      if (c == '\n') c = ' ';
    }
    std::cerr << "ddp-run: " << what << ". HINT: ddp-run --help" << std::endl;
    return 2;
  }

  try {
    auto& registry = ddp::builtinPlugins();
    if (!args.pluginLibs.empty() && !(args.listPlugins || args.schema || !args.describe.empty())) {
      throw ddp::UsageError(
          "--plugin-lib is for --list-plugins, --describe and --schema. HINT: an experiment loads its plugin "
          "libraries from its \"plugins\" key");
    }
    for (const std::string& lib : args.pluginLibs) ddp::loadPluginLibrary(lib, registry);
    if (args.schema) {
      std::cout << ddp::experimentSchema(registry).dump(2) << "\n";
      return 0;
    }
    if (args.version) {
      std::vector<std::string> backends;
      for (const auto& name : ddp::builtinBackends().names()) {
        backends.push_back(ddp::builtinBackends().compiledOut(name) ? name + " (not built)" : name);
      }
      std::cout << fmt::format("ddp-run {}\nplugin API version {}\nLibTorch {} ({})\nbackends: {}\n", DDP_VERSION,
                               DDP_PLUGIN_API_VERSION, TORCH_VERSION,
                               torch::cuda::is_available() ? fmt::format("CUDA, {} GPU(s)", torch::cuda::device_count())
                                                           : std::string("CPU"),
                               fmt::join(backends, ", "));
      return 0;
    }
    if (args.listPlugins) {
      std::cout << registry.listing();
      return 0;
    }
    if (!args.describe.empty()) {
      if (auto text = ddp::describeSection(args.describe, registry)) {
        std::cout << *text;
      } else {
        std::cout << registry.describe(args.describe);
      }
      return 0;
    }
    if (!args.sample.runDir.empty() && (!args.experiment.empty() || !args.overrides.empty())) {
      std::cerr << fmt::format("ddp-run: --sample reads the model and its settings from {}/config.json; an experiment "
                               "file or --set beside it would be ignored. HINT: ddp-run --sample {} (alone)",
                               args.sample.runDir, args.sample.runDir)
                << std::endl;
      return 2;
    }
    if (!args.sample.runDir.empty()) {
      ddp::apps::sampleText(args.sample, registry, std::cout);
      return 0;
    }
    if (!args.exportWeights.runDir.empty()) {
      if (!args.experiment.empty() || !args.overrides.empty()) {
        std::cerr << fmt::format("ddp-run: --export reads the model and its settings from {}/config.json; an "
                                 "experiment file or --set beside it would be ignored. HINT: ddp-run --export {} "
                                 "[--format safetensors|torch] [-o FILE]",
                                 args.exportWeights.runDir, args.exportWeights.runDir)
                  << std::endl;
        return 2;
      }
      args.exportWeights.checkpoint = args.sample.checkpoint;
      ddp::apps::exportWeights(args.exportWeights, registry, std::cout);
      return 0;
    }
    if (!args.exportWeights.output.empty()) {
      std::cerr << "ddp-run: -o names the file of --export. HINT: ddp-run --export RUN_DIR -o FILE" << std::endl;
      return 2;
    }
    const auto env = ddp::rankEnvFromEnvironment(ddp::currentEnvironment());
    const bool isRank = env.has_value() && (env->source == "ddp-run" || args.nprocPerNode == 0);
    if (args.demo) {
      if (!isRank && args.nprocPerNode > 0) {
        checkBackendUsable("--demo-backend", args.demoBackend);
        ddp::LaunchOptions lo;
        lo.nprocPerNode = args.nprocPerNode;
        lo.nnodes = args.nnodes;  // the demo across nodes too, as an experiment would run
        lo.nodeRank = args.nodeRank;
        lo.masterAddr = args.masterAddr;
        lo.masterPort = args.masterPort;
        lo.backend = args.demoBackend;
        applyLogOptions(args, args.nprocPerNode, lo);
        lo.killGrace = std::chrono::milliseconds(static_cast<int64_t>(args.killGrace * 1000));
        lo.workerArgv = {"/proc/self/exe"};
        for (int i = 1; i < argc; ++i) lo.workerArgv.push_back(argv[i]);
        lo.workerEntry = rankInLaunchersCopy;
        return ddp::launchLocalRanks(lo);
      }
      return runDemo(env.value_or(ddp::RankEnv{}), args.demoBackend);
    }
    // --resume --out DIR alone: the run's own resolved experiment.
    if (args.experiment.empty() && args.resume && !args.outDir.empty()) {
      args.experiment = args.outDir + "/config.json";
      std::ifstream probe(args.experiment);
      if (!probe) {
        std::cerr << fmt::format("ddp-run: --resume: {} holds no config.json to continue from. HINT: --out the folder "
                                 "of a run, or give its experiment file",
                                 args.outDir)
                  << std::endl;
        return 2;
      }
    }
    if (args.experiment.empty()) {
      std::cerr << "ddp-run: no experiment given. HINT: ddp-run experiments/wine_baseline.json "
                   "(or --list-plugins, --demo)"
                << std::endl;
      return 2;
    }
    // --resume continues the run in --out; without it, a new folder would be made.
    if (args.resume && args.outDir.empty()) {
      std::cerr << "ddp-run: --resume needs the run folder to continue. HINT: --out RUN_DIR" << std::endl;
      return 2;
    }
    if (isRank) return runRank(args, *env);

    // Launcher: validate everything before any process or folder exists.
    ddp::ExperimentConfig config = ddp::loadExperimentConfig(args.experiment, args.overrides, registry);
    const int nproc = args.nprocPerNode > 0 ? args.nprocPerNode : static_cast<int>(config.distributed.nprocPerNode);
    {
      std::vector<std::string> withWorld = args.overrides;
      recordWorld(withWorld, nproc, args.nnodes);
      config = ddp::loadExperimentConfig(args.experiment, withWorld, registry);
    }
    const ReservedRunDir removeIfUnused;
    // Node 0's launcher only: another node's (a replacement's, or one that
    // starts late on a shared file system) may find rank 0's run there. A
    // replacement of node 0 finds it too: the launcher runs this check once
    // it knows that this node starts the job rather than replacing a lost
    // one (launcher.hpp, freshStartCheck).
    const bool freshStart = !args.outDir.empty() && !args.resume && !isRestart() && args.nodeRank == 0;
    const std::string outDir = args.outDir;
    auto checkFolderFree = [outDir] { ddp::checkRunFolderIsFree(outDir); };
    std::string runDir = args.outDir.empty() ? defaultRunDir(config) : args.outDir;
    if (nproc == 1 && args.nnodes == 1) {
      // One rank runs without a backend compiled out of this build; one
      // that is built but cannot run here (nccl without GPUs) is named as
      // it is for several ranks.
      if (!ddp::builtinBackends().compiledOut(config.distributed.backend)) {
        checkBackendUsable("distributed.backend", config.distributed.backend);
      }
      if (freshStart) checkFolderFree();
      Args single = args;
      single.outDir = runDir;
      return runRank(single, ddp::RankEnv{}, std::move(config));
    }
    checkBackendUsable("distributed.backend", config.distributed.backend);
    if (config.distributed.device == "cuda" && !torch::cuda::is_available()) {
      throw ddp::UsageError(fmt::format(
          "distributed.device: \"cuda\" needs a CUDA build of LibTorch and a GPU; found {} device(s). HINT: --set "
          "distributed.device=cpu",
          torch::cuda::device_count()));
    }
    // What only the built plugins can tell, once here rather than once per rank.
    ddp::checkExperimentBuilds(config, registry);
    ddp::LaunchOptions lo;
    lo.nprocPerNode = nproc;
    lo.nnodes = args.nnodes;
    lo.nodeRank = args.nodeRank;
    lo.masterAddr = args.masterAddr;
    lo.masterPort = args.masterPort;
    lo.maxRestarts = args.maxRestarts;
    lo.minRanks = args.minRanks;
    lo.storeUrl = args.storeUrl;
    if (freshStart) lo.freshStartCheck = checkFolderFree;
    if (args.minRanks > 0 && config.distributed.strategy != "ddp") {
      throw ddp::UsageError(fmt::format(
          "--min-ranks: distributed.strategy {} cannot recover in place (its optimizer state is sharded). HINT: "
          "--set distributed.strategy=ddp, or --max-restarts without --min-ranks",
          config.distributed.strategy));
    }
    if (args.minRanks > nproc * args.nnodes) {
      throw ddp::UsageError(fmt::format("--min-ranks {} is more than the job's {} ranks. HINT: --min-ranks {}",
                                        args.minRanks, nproc * args.nnodes, nproc * args.nnodes));
    }
    lo.killGrace = std::chrono::milliseconds(static_cast<int64_t>(args.killGrace * 1000));
    lo.backend = config.distributed.backend;
    applyLogOptions(args, nproc, lo);
    lo.workerArgv = {"/proc/self/exe", args.experiment, "--out", runDir};
    for (const auto& o : args.overrides) {
      lo.workerArgv.push_back("--set");
      lo.workerArgv.push_back(o);
    }
    // The ranks' config.json records the world they ran in.
    lo.workerArgv.insert(lo.workerArgv.end(), {"--set", fmt::format("distributed.nproc_per_node={}", nproc), "--set",
                                               fmt::format("distributed.nnodes={}", args.nnodes)});
    if (args.resume) lo.workerArgv.push_back("--resume");
    lo.workerEntry = rankInLaunchersCopy;
    return ddp::launchLocalRanks(lo);
  } catch (const ddp::UsageError& e) {
    std::cerr << e.what() << std::endl;
    ddp::recordFailureForTorchrun("UsageError", e.what());
    return 2;
  } catch (const ddp::ElasticSlowHost& e) {
    // Left out for its host's slow link: not started again into it.
    std::cerr << "ddp-run: " << e.what() << std::endl;
    ddp::recordFailureForTorchrun("ElasticSlowHost", e.what());
    return ddp::kExitSlowHost;
  } catch (const ddp::ElasticExcluded& e) {
    // Left out of an elastic job's new membership (it hung, or arrived
    // late): the launcher may start it again as a joiner.
    std::cerr << "ddp-run: " << e.what() << std::endl;
    return ddp::kExitExcluded;
  } catch (const ddp::ElasticStalled& e) {
    std::cerr << "ddp-run: " << e.what() << std::endl;
    ddp::recordFailureForTorchrun("ElasticStalled", e.what());
    return ddp::kExitStalled;
  } catch (const ddp::ElasticBelowMinimum& e) {
    std::cerr << "ddp-run: " << e.what() << std::endl;
    ddp::recordFailureForTorchrun("ElasticBelowMinimum", e.what());
    return ddp::kExitBelowMinRanks;
  } catch (const ddp::NonFiniteLossError& e) {
    // Training diverged: not a mistake in the input as such, not a crash.
    std::cerr << e.what() << std::endl;
    ddp::recordFailureForTorchrun("NonFiniteLossError", e.what());
    return 3;
  } catch (const std::exception& e) {
    // One line, LibTorch's errors included (their backtrace dropped).
    std::cerr << "ddp-run: " << ddp::errorLine(e) << std::endl;
    ddp::recordFailureForTorchrun("Error", ddp::errorLine(e));
    return 1;
  }
}

}  // namespace
