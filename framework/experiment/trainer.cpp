#include "framework/experiment/trainer.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <torch/serialize.h>
#include <torch/cuda.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "framework/core/errors.hpp"
#include "framework/core/system.hpp"
#include "framework/core/trace.hpp"
#include "framework/experiment/callbacks/checkpoints.hpp"
#include "framework/experiment/callbacks/epoch_log.hpp"
#include "framework/experiment/callbacks/fault_injection.hpp"
#include "framework/experiment/callbacks/metrics_files.hpp"
#include "framework/experiment/callbacks/progress_line.hpp"
#include "framework/experiment/callbacks/step_metrics.hpp"
#include "framework/experiment/callbacks/trace_writer.hpp"
#include "framework/experiment/resume_rules.hpp"
#include "framework/experiment/run_folder.hpp"
#include "framework/experiment/run_log.hpp"
#include "framework/experiment/trained_model.hpp"
#include "framework/core/append_file.hpp"
#include "framework/parallel/sampler.hpp"
#include "framework/parallel/strategy.hpp"

namespace ddp {
namespace {

using Clock = std::chrono::steady_clock;

// A plugin's factory run with its errors made one line that names it:
// running out of memory (std::bad_alloc, LibTorch's "can't allocate") is
// the experiment's size, a UsageError; any other LibTorch error loses its
// backtrace. UsageErrors pass as they are.
template <typename Make>
auto building(const char* kind, const std::string& name, Make&& make) -> decltype(make()) {
  try {
    return make();
  } catch (const UsageError&) {
    throw;
  } catch (const std::bad_alloc&) {
    fail<UsageError>("{} {}: out of memory while building it. HINT: a smaller {} (or a machine with more memory)", kind,
                     name, kind);
  } catch (const c10::Error& e) {
    const std::string what = errorLine(e);
    if (what.find("can't allocate") != std::string::npos || what.find("out of memory") != std::string::npos) {
      std::string size;
      if (const auto tried = what.find("tried to allocate "); tried != std::string::npos) {
        const double bytes = std::strtod(what.c_str() + tried + 18, nullptr);
        if (bytes > 0) size = fmt::format(" ({:.4g} GiB asked for)", bytes / double(1 << 30));
      }
      fail<UsageError>("{} {}: out of memory while building it{}. HINT: a smaller {} (or a machine with more memory)",
                       kind, name, size, kind);
    }
    fail<std::runtime_error>("{} {}: {}", kind, name, what);
  }
}

// "nan" (whatever its sign bit), "inf" or "-inf".
const char* nonFiniteName(double v) { return std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf"; }

std::string shapeOf(const at::Tensor& t) {
  return fmt::format("{} {}", c10::str(t.sizes()), c10::toString(t.scalar_type()));
}

// Before the run folder exists: the model's forward and the loss on the
// first two training rows, without gradients, so that a dataset, model and
// loss that do not fit together (a regression dataset with cross_entropy,
// an output width that is not the target's) fail here, as one line naming
// the three with the shapes, not in the first step with a folder left
// behind. It runs once; eval mode, so that it draws no random numbers.
void checkPluginsFit(const ExperimentConfig& config, const DatasetSplits& data, Model& model, const LossFn& lossFn,
                     const torch::Device& device) {
  if (data.train->size() == 0) return;
  const Batch first = data.train->range(0, 2);
  const at::Tensor x = first.inputs.to(device);
  const at::Tensor y = first.targets.to(device);
  const std::string task = data.task == Task::Regression
                               ? std::string("regression")
                               : fmt::format("{}, {} classes", taskName(data.task), data.numClasses);
  torch::NoGradGuard noGrad;
  const bool training = model.is_training();
  model.eval();
  at::Tensor out;
  std::string where = fmt::format("dataset {} ({}; features {}, targets {}) -> model {}", config.dataset.name, task,
                                  shapeOf(x), shapeOf(y), config.model.name);
  try {
    out = model.forward(x);
    where += fmt::format(" (output {}) -> loss {}", shapeOf(out), config.loss.name);
    (void)lossFn(out, y);
  } catch (const std::exception& e) {
    std::string hint;
    if (data.numClasses == 0 && config.loss.name == "cross_entropy") {
      hint = " HINT: a regression dataset needs a regression loss (\"loss\": {\"name\": \"mse\"}), or set the "
             "dataset's \"task\": \"classification\"";
    } else if (out.defined() && data.numClasses == 0 && out.dim() == 2 && out.size(1) != 1) {
      hint = " HINT: a regression model has one output; make the last width of model.layers 1 (or 0: taken from the "
             "dataset)";
    }
    std::string what = errorLine(e);
    if (hint.empty() || what.find("HINT:") != std::string::npos) {
      fail<UsageError>("{} do not fit together: {}", where, what);
    }
    fail<UsageError>("{} do not fit together: {}.{}", where, what, hint);
  }
  model.train(training);
}

// Renames metrics.jsonl, metrics.csv and steps.jsonl of `runDir` to
// NAME.before-restart-K.EXT with the first K that none of them has; returns
// what the new names look like, for the log.
std::string keepRecordsAside(const std::string& runDir) {
  std::error_code ec;
  const std::filesystem::path dir(runDir);
  const std::filesystem::path records[] = {"metrics.jsonl", "metrics.csv", "steps.jsonl"};
  const auto kept = [&](const std::filesystem::path& name, int k) {
    return dir / fmt::format("{}.before-restart-{}{}", name.stem().string(), k, name.extension().string());
  };
  int k = 1;
  while (std::any_of(std::begin(records), std::end(records),
                     [&](const auto& name) { return std::filesystem::exists(kept(name, k), ec); })) {
    ++k;
  }
  for (const auto& name : records) {
    if (!std::filesystem::exists(dir / name, ec)) continue;
    std::filesystem::rename(dir / name, kept(name, k), ec);
    if (ec) {
      fail<std::runtime_error>("restart: cannot keep {} as {}: {}", (dir / name).string(), kept(name, k).string(),
                               ec.message());
    }
  }
  return fmt::format("{}/metrics.before-restart-{}.{{jsonl,csv}}", runDir, k);
}

void makeRunFolder(const std::string& runDir) {
  std::error_code ec;
  std::filesystem::create_directories(runDir, ec);
  if (ec) fail<UsageError>("cannot create run folder {}: {}", runDir, ec.message());
}

}  // namespace

void checkRunFolderIsFree(const std::string& runDir) {
  std::error_code ec;
  const bool hasMetrics = std::filesystem::exists(runDir + "/metrics.jsonl", ec);
  const bool hasCheckpoints = !std::filesystem::is_empty(runDir + "/checkpoints", ec) && !ec;
  if (hasMetrics || hasCheckpoints) {
    fail<UsageError>("run folder {} already holds a run ({}). HINT: --resume to continue it, or another --out", runDir,
                     hasCheckpoints ? "checkpoints/" : "metrics.jsonl");
  }
}

namespace {

// What a checkpoint holds besides the model and optimizer.
struct CheckpointState {
  int64_t epoch = 0;  // epochs finished
  int64_t batch = 0;  // batches of the next epoch finished (a checkpoint on a signal)
  int64_t steps = 0;
  std::vector<double> partial;  // that epoch's loss sum and samples so far, over all ranks
};

// Every rank, before the strategy exists: model and optimizer state, RNG
// and step count. The optimizer's hyper-parameters stay those of the
// experiment (resume_rules.hpp lets them change). Any failure is one
// runtime_error naming the file.
CheckpointState loadCheckpoint(const std::string& path, torch::nn::Module& model,
                               torch::optim::Optimizer& optimizer) {
  CheckpointState state;
  try {
    std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> options;
    for (auto& g : optimizer.param_groups()) options.push_back(g.options().clone());
    torch::serialize::InputArchive archive;
    archive.load_from(path);
    loadModelAndOptimizer(archive, model, optimizer);
    at::Tensor epoch, steps, rng, batch, partial;
    archive.read("epoch", epoch);
    archive.read("steps", steps);
    archive.read("rng", rng);
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    generator.set_state(rng);
    state.epoch = epoch.item<int64_t>();
    state.steps = steps.item<int64_t>();
    if (archive.try_read("batch", batch)) state.batch = batch.item<int64_t>();
    if (archive.try_read("partial", partial)) {
      partial = partial.to(at::kDouble).contiguous();
      state.partial.assign(partial.data_ptr<double>(), partial.data_ptr<double>() + partial.numel());
    }
    auto& groups = optimizer.param_groups();
    for (size_t g = 0; g < groups.size() && g < options.size(); ++g) groups[g].set_options(std::move(options[g]));
  } catch (const std::exception& e) {
    std::string why = e.what();
    why = why.substr(0, why.find('\n'));
    fail<std::runtime_error>("checkpoint {} cannot be read ({})", path, why);
  }
  return state;
}

// SIGTERM and SIGINT while a run with training.checkpoint_on_signal trains:
// the handler records the signal, the training loop acts on it at the next
// step. A second signal takes its default action at once.
std::atomic<int> gStopSignal{0};

void recordStopSignal(int sig) {
  if (gStopSignal.load() != 0) {
    ::signal(sig, SIG_DFL);
    ::raise(sig);
    return;
  }
  gStopSignal.store(sig);
}

class StopSignals {
 public:
  explicit StopSignals(bool enabled) : enabled_(enabled) {
    if (!enabled_) return;
    gStopSignal.store(0);
    struct sigaction action {};
    action.sa_handler = recordStopSignal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    ::sigaction(SIGTERM, &action, &oldTerm_);
    ::sigaction(SIGINT, &action, &oldInt_);
  }
  ~StopSignals() {
    if (!enabled_) return;
    ::sigaction(SIGTERM, &oldTerm_, nullptr);
    ::sigaction(SIGINT, &oldInt_, nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  bool enabled_;
  struct sigaction oldTerm_ {}, oldInt_ {};
};

const char* const kStartKey = "ddp-trainer/start";

// Rank 0, once the plugins are built and before anything is written: makes
// or (on resume) checks the run folder, and returns the checkpoint to resume
// from ("" for none), loaded into model and optimizer. Nothing in the
// folder changes before every check has passed; config.json is written last.
std::string prepareRunFolder(const ExperimentConfig& config, const RunOptions& options, torch::nn::Module& model,
                             torch::optim::Optimizer& optimizer, std::vector<std::string>* notes,
                             CheckpointState* state, std::unique_ptr<RunFolderLock>* lock,
                             const std::map<std::string, std::string>& runFiles) {
  const std::string& runDir = options.runDir;
  const std::string configPath = runDir + "/config.json";
  std::error_code ec;
  std::string chosen;
  // A restart by a launcher or scheduler before the folder held a run starts it.
  if (options.resume && (!options.restart || std::filesystem::exists(configPath, ec))) {
    if (!std::filesystem::is_directory(runDir, ec)) {
      if (std::filesystem::exists(runDir, ec)) {
        fail<UsageError>("--resume: {} is a file, not a run folder. HINT: --out the folder of the run to continue",
                         runDir);
      }
      fail<UsageError>("--resume: run folder {} does not exist. HINT: --out the folder of the run to continue", runDir);
    }
    *lock = std::make_unique<RunFolderLock>(runDir);
    std::ifstream in(configPath);
    if (!in) {
      fail<UsageError>(
          "--resume: {} holds no config.json, so no run to continue. HINT: --out the folder of the run to continue",
          runDir);
    }
    Json saved = Json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (saved.is_discarded()) {
      fail<UsageError>("--resume: {} is not valid JSON. HINT: restore it, or start a new run with another --out",
                       configPath);
    }
    if (!config.resolved.is_null()) {
      for (const ConfigChange& change : checkResumeChanges(runDir, saved, config.resolved)) {
        notes->push_back(fmt::format("resume: {} {} -> {}", change.key, change.before, change.after));
      }
    }
    // The newest checkpoint that loads; every other rank loads the same file.
    std::vector<std::string> unreadable;
    const std::vector<CheckpointFile> checkpoints = listCheckpoints(runDir);
    for (const CheckpointFile& file : checkpoints) {
      try {
        *state = loadCheckpoint(file.path, model, optimizer);
        chosen = file.path;
        break;
      } catch (const std::runtime_error& e) {
        unreadable.push_back(e.what());
      }
    }
    if (!checkpoints.empty() && chosen.empty()) {
      fail<std::runtime_error>("--resume: no checkpoint in {}/checkpoints can be read; the newest: {}", runDir,
                               unreadable.front());
    }
    for (const std::string& why : unreadable) notes->push_back(fmt::format("{}; resuming from {}", why, chosen));
    const auto metricsBytes = std::filesystem::file_size(runDir + "/metrics.jsonl", ec);
    if (chosen.empty() && !options.restart && !ec && metricsBytes > 0) {
      fail<UsageError>(
          "--resume: {} holds metrics but no checkpoint to continue from; starting again would overwrite them. HINT: "
          "runs to be resumed need training.save_every > 0; start this one again with another --out",
          runDir);
    }
    std::error_code stepsEc;
    const auto stepsBytes = std::filesystem::file_size(runDir + "/steps.jsonl", stepsEc);
    if (chosen.empty() && options.restart && ((!ec && metricsBytes > 0) || (!stepsEc && stepsBytes > 0))) {
      // A restart with nothing to resume from starts over; the records of
      // the attempt before are kept beside the new ones, not overwritten.
      const std::string kept = keepRecordsAside(runDir);
      notes->push_back(fmt::format(
          "restart: no checkpoint to continue from, so training starts over; the earlier records are kept as {}. "
          "HINT: training.save_every > 0 lets a restart resume instead",
          kept));
    }
  } else {
    makeRunFolder(runDir);
    *lock = std::make_unique<RunFolderLock>(runDir);
  }
  checkWritable(runDir);
  if (config.training.saveEvery > 0 || config.training.checkpointOnSignal) checkWritable(runDir + "/checkpoints");
  // What the dataset leaves for later use of the run (a vocabulary).
  for (const auto& [name, contents] : runFiles) writeFileAtomically(runDir + "/" + name, contents);
  if (!config.resolved.is_null()) writeFileAtomically(configPath, config.resolved.dump(2) + "\n");
  return chosen;
}

}  // namespace

// What build() makes and the epochs use.
struct Trainer::Impl {
  bool built = false;
  torch::Device device{torch::kCPU};
  DatasetSplits data;
  ModelPtr model;
  std::unique_ptr<ParallelStrategy> strategy;
  std::unique_ptr<LrScheduler> scheduler;
  LossFn lossFn;
  std::vector<double> baseLrs;
  std::unique_ptr<RunLog> log;
  std::unique_ptr<DistributedSampler> sampler;
  bool join = false;  // unpadded shards; a rank that runs out shadows its peers' last steps
  std::vector<int64_t> testRows;  // this rank's shard of the test split
  int64_t startEpoch = 0;
  int64_t steps = 0;
  bool stop = false;  // training.max_steps reached, or a signal
  std::unique_ptr<RunFolderLock> lock;  // rank 0: this job owns the run folder
  int64_t resumeBatch = 0;              // batches of epoch startEpoch done before (a checkpoint on a signal)
  std::vector<double> resumeSums;       // their loss sum and samples, over all ranks (rank 0 adds them)
  bool watchSignals = false;            // training.checkpoint_on_signal
  at::Tensor signalFlag;                // the agreed stop signal, one int64
  int signal = 0;                       // the signal all ranks stopped on
  int64_t batchesDone = 0;              // of the epoch the signal stopped
  double dataSeconds = 0;               // batch assembly in the current epoch
  bool partialEpoch = false;            // the signal stopped an epoch before its end
  int64_t lastSaved = -1;               // epoch of the last checkpoint written
  std::vector<std::shared_ptr<TrainerCallback>> callbacks;
  std::vector<TrainerCallback*> stepCallbacks;  // those that want onStepEnd
};

Trainer::Trainer(const ExperimentConfig& config, const DistributedContext& dist, const RunOptions& options,
                 PluginRegistry& registry)
    : config_(config), dist_(dist), options_(options), registry_(registry), impl_(std::make_unique<Impl>()) {}

Trainer::~Trainer() = default;

int Trainer::rank() const { return dist_.group->rank(); }
int Trainer::worldSize() const { return dist_.group->size(); }
int64_t Trainer::startEpoch() const { return impl_->startEpoch; }
Task Trainer::task() const { return impl_->data.task; }
int64_t Trainer::steps() const { return impl_->steps; }
int64_t Trainer::trainSamples() const { return impl_->data.train ? impl_->data.train->size() : 0; }

ParallelStrategy& Trainer::strategy() {
  DDP_CHECK(impl_->strategy != nullptr, "Trainer::strategy() before build()");
  return *impl_->strategy;
}

RunLog& Trainer::log() {
  DDP_CHECK(impl_->log != nullptr, "Trainer::log() before build()");
  return *impl_->log;
}

void Trainer::addCallback(std::shared_ptr<TrainerCallback> callback) {
  DDP_CHECK(callback != nullptr, "Trainer::addCallback(nullptr)");
  if (callback->wantsSteps()) impl_->stepCallbacks.push_back(callback.get());
  impl_->callbacks.push_back(std::move(callback));
}

void Trainer::addStandardCallbacks() {
  if (auto fault = FaultInjection::fromEnvironment(rank())) addCallback(fault);
  if (auto slow = SlowRank::fromEnvironment(rank())) addCallback(slow);
  if (ProgressLine::wanted(*this)) addCallback(std::make_shared<ProgressLine>());
  // Every rank (one collective per epoch), before the metrics files that
  // write what it adds.
  addCallback(std::make_shared<StepMetrics>());
  // Every rank (it gathers the ranks' spans).
  if (TraceWriter::wanted(*this)) addCallback(std::make_shared<TraceWriter>());
  if (isWriter()) {
    addCallback(std::make_shared<MetricsFiles>());
    addCallback(std::make_shared<EpochLog>());
  }
  if (config_.training.saveEvery > 0) addCallback(std::make_shared<PeriodicCheckpoints>(config_.training.saveEvery));
}

namespace {

// An experiment's plugins, as Trainer::build() and the launcher's check
// build them.
struct BuiltPlugins {
  DatasetSplits data;
  ModelPtr model;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::unique_ptr<LrScheduler> scheduler;
  LossFn lossFn;
};

// Seeds LibTorch with training.seed (the same split and initial weights on
// every rank), builds each plugin (an error names it), moves the model to
// `device` before the optimizer takes its parameters, and, when `checkFit`,
// runs the model and the loss on two rows there (checkPluginsFit).
BuiltPlugins buildPlugins(const ExperimentConfig& config, PluginRegistry& registry, const torch::Device& device,
                          bool checkFit) {
  BuiltPlugins b;
  torch::manual_seed(config.training.seed);
  DatasetContext dctx{config.training.seed, config.configDir};
  b.data = building("dataset", config.dataset.name, [&] {
    return registry.get(PluginKind::Dataset, config.dataset.name).dataset(config.dataset.params, dctx);
  });
  const ModelContext modelContext = modelContextFor(b.data);
  b.model = building("model", config.model.name, [&] {
    return registry.get(PluginKind::Model, config.model.name).model(config.model.params, modelContext);
  });
  // So the trained model can be rebuilt without its data (trained_model.hpp).
  b.data.runFiles["model_context.json"] = modelContextJson(modelContext, b.data.task);
  if (!b.data.train || !b.data.test) {
    fail<std::runtime_error>("dataset {}: its factory returned no train or no test split", config.dataset.name);
  }
  if (device.is_cuda()) b.model->to(device);
  b.optimizer = building("optimizer", config.optimizer.name, [&] {
    return registry.get(PluginKind::Optimizer, config.optimizer.name)
        .optimizer(b.model->parameters(), config.optimizer.params);
  });
  if (config.scheduler) {
    b.scheduler = building("scheduler", config.scheduler->name, [&] {
      return registry.get(PluginKind::Scheduler, config.scheduler->name).scheduler(config.scheduler->params);
    });
  }
  b.lossFn = building("loss", config.loss.name,
                      [&] { return registry.get(PluginKind::Loss, config.loss.name).loss(config.loss.params); });
  if (checkFit) checkPluginsFit(config, b.data, *b.model, b.lossFn, device);
  return b;
}

}  // namespace

void checkExperimentBuilds(const ExperimentConfig& config, PluginRegistry& registry) {
  // A model meant for GPUs may have CUDA-only code: the ranks check it there.
  buildPlugins(config, registry, torch::Device(torch::kCPU), /*checkFit=*/config.distributed.device == "cpu");
}

void Trainer::build() {
  if (impl_->built) return;
  Impl& s = *impl_;
  const auto& tc = config_.training;
  const ExperimentConfig& config = config_;
  PluginRegistry& registry = registry_;
  if (tc.threads > 0) at::set_num_threads(static_cast<int>(tc.threads));

  // rank -> cuda:LOCAL_RANK when the experiment asks for GPUs.
  if (config.distributed.device == "cuda") {
    if (!torch::cuda::is_available()) {
      fail<UsageError>(
          "distributed.device: \"cuda\" needs a CUDA build of LibTorch and a GPU; found {} device(s). HINT: --set "
          "distributed.device=cpu",
          torch::cuda::device_count());
    }
    s.device = torch::Device(torch::kCUDA,
                             static_cast<c10::DeviceIndex>(dist_.env.localRank % torch::cuda::device_count()));
  }

  BuiltPlugins built = buildPlugins(config, registry, s.device, /*checkFit=*/true);
  s.data = std::move(built.data);
  s.model = std::move(built.model);
  s.scheduler = std::move(built.scheduler);
  s.lossFn = std::move(built.lossFn);
  std::unique_ptr<torch::optim::Optimizer> optimizer = std::move(built.optimizer);
  DatasetSplits& data = s.data;
  ModelPtr& model = s.model;
  for (auto& g : optimizer->param_groups()) s.baseLrs.push_back(g.options().get_lr());

  // Rank 0 takes the run folder and decides what every rank resumes from;
  // the others learn it through the store, or that rank 0 refused.
  std::vector<std::string> notes;  // for train.log, once it is open
  std::string resumeFrom;
  CheckpointState state;
  if (isWriter()) {
    const auto share = [&](const std::string& value) {
      if (worldSize() > 1 && dist_.store) dist_.store->setString(kStartKey, value);
    };
    try {
      resumeFrom = prepareRunFolder(config, options_, *model, *optimizer, &notes, &state, &s.lock, data.runFiles);
    } catch (const UsageError& e) {
      share(std::string("usage:") + e.what());
      throw;
    } catch (const std::exception& e) {
      share(std::string("error:") + e.what());
      throw;
    }
    share("ok:" + resumeFrom);
  } else if (worldSize() > 1 && dist_.store) {
    const std::string start = dist_.store->getString(kStartKey);
    if (start.rfind("usage:", 0) == 0) fail<UsageError>("rank 0 did not start the run: {}", start.substr(6));
    if (start.rfind("error:", 0) == 0) fail<std::runtime_error>("rank 0 did not start the run: {}", start.substr(6));
    resumeFrom = start.substr(3);
    if (!resumeFrom.empty()) state = loadCheckpoint(resumeFrom, *model, *optimizer);
  }
  s.log = std::make_unique<RunLog>(isWriter(), options_.runDir, options_.quiet);
  for (const std::string& note : notes) s.log->line(note);
  if (!resumeFrom.empty()) {
    s.startEpoch = state.epoch;
    s.steps = state.steps;
    s.resumeBatch = state.batch;
    if (isWriter()) s.resumeSums = state.partial;
    s.log->line(state.batch > 0 ? fmt::format("resumed from {} after epoch {} and {} batches of epoch {}", resumeFrom,
                                              state.epoch, state.batch, state.epoch + 1)
                                : fmt::format("resumed from {} after epoch {}", resumeFrom, state.epoch));
  } else if (options_.resume) {
    s.log->line(fmt::format("resume: no checkpoint in {}/checkpoints; starting from scratch", options_.runDir));
  }

  StrategyContext context;
  context.model = model;
  context.optimizer = std::move(optimizer);
  context.group = dist_.group;
  context.ddp.bucketCapBytes = static_cast<size_t>(config.distributed.bucketCapMb * 1024 * 1024);
  context.ddp.firstBucketCapBytes = static_cast<size_t>(config.distributed.firstBucketCapMb * 1024 * 1024);
  context.ddp.findUnusedParameters = config.distributed.findUnusedParameters;
  if (config.distributed.commHook) {
    const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(config.distributed.timeoutSeconds * 1000));
    context.ddp.commHook = registry.get(PluginKind::CommHook, config.distributed.commHook->name)
                               .commHook(config.distributed.commHook->params, timeout);
  }
  context.fsdp.backwardPrefetch = config.distributed.fsdpBackwardPrefetch;
  context.fsdp.unitBytes = static_cast<int64_t>(config.distributed.fsdpUnitMb * 1024 * 1024);
  s.strategy = builtinStrategies().create(config.distributed.strategy, std::move(context));

  const int r = rank(), world = worldSize();
  // Uneven inputs: unpadded shards where the strategy can shadow steps.
  const bool uneven = tc.join && !tc.dropLast && world > 1 && data.train->size() % world != 0;
  s.join = uneven && s.strategy->supportsJoin();
  if (uneven && !s.join) {
    s.log->line(fmt::format("training.join: strategy {} cannot shadow steps; the {} training samples are padded to "
                            "{} per rank",
                            s.strategy->name(), data.train->size(), (data.train->size() + world - 1) / world));
  }
  s.sampler = std::make_unique<DistributedSampler>(data.train->size(), r, world, tc.seed, /*shuffle=*/true,
                                                   tc.dropLast, /*pad=*/!s.join);
  s.sampler->setEpoch(s.startEpoch);

  // The test split, sharded: rank r evaluates samples r, r+w, ...; sums are reduced.
  for (int64_t i = r; i < data.test->size(); i += world) s.testRows.push_back(i);
  s.built = true;
}

std::pair<double, double> Trainer::trainEpoch(int64_t epoch) {
  Impl& s = *impl_;
  const auto& tc = config_.training;
  const auto& data = s.data;
  ParallelStrategy& strategy = *s.strategy;
  torch::nn::Module& model = *s.model;
  model.train();
  if (s.scheduler) {
    auto& groups = strategy.optimizer().param_groups();
    for (size_t g = 0; g < groups.size(); ++g) groups[g].options().set_lr(s.scheduler->lrAt(epoch, s.baseLrs[g]));
  }
  const std::vector<int64_t> order = s.sampler->nextEpoch();
  const auto myN = static_cast<int64_t>(order.size());
  double lossSum = 0;
  int64_t seen = 0;
  const int64_t batches = (myN + tc.batchSize - 1) / tc.batchSize;
  const int64_t usable = tc.dropLast ? myN / tc.batchSize : batches;
  int64_t micro = 0;
  // Resumed from a checkpoint taken on a signal: the rest of that epoch.
  const int64_t firstBatch = std::exchange(s.resumeBatch, 0);
  if (s.resumeSums.size() == 2) {
    lossSum = s.resumeSums[0];
    seen = static_cast<int64_t>(s.resumeSums[1]);
  }
  s.resumeSums.clear();
  s.partialEpoch = false;
  // Steps of this epoch per rank: with unpadded shards (s.join) a rank may
  // have one step fewer than its peers; it shadows that step. Every rank
  // knows every rank's count, so no collective decides it.
  const int world = worldSize();
  auto stepsOf = [&](int64_t samples) {
    const int64_t b = tc.dropLast ? samples / tc.batchSize : (samples + tc.batchSize - 1) / tc.batchSize;
    return (b + tc.accumulateGradBatches - 1) / tc.accumulateGradBatches;
  };
  std::vector<int64_t> rankSteps(static_cast<size_t>(world), stepsOf(myN));
  if (s.join) {
    for (int q = 0; q < world; ++q) {
      rankSteps[static_cast<size_t>(q)] =
          stepsOf(DistributedSampler::samplesFor(s.sampler->datasetSize(), q, world, tc.dropLast, /*pad=*/false));
    }
  }
  auto contributorsAt = [&](int64_t stepInEpoch) {
    return static_cast<int>(
        std::count_if(rankSteps.begin(), rankSteps.end(), [&](int64_t n) { return n > stepInEpoch; }));
  };
  int64_t stepInEpoch = firstBatch / tc.accumulateGradBatches;
  for (int64_t b = firstBatch; b < usable && !s.stop; ++b) {
    const int64_t begin = b * tc.batchSize, len = std::min(tc.batchSize, myN - begin);
    const auto fetchStart = Clock::now();
    Batch batch = data.train->get(c10::ArrayRef<int64_t>(order.data() + begin, static_cast<size_t>(len)));
    const at::Tensor x = batch.inputs.to(s.device, /*non_blocking=*/true);
    const at::Tensor y = batch.targets.to(s.device, /*non_blocking=*/true);
    const auto fetchEnd = Clock::now();
    s.dataSeconds += std::chrono::duration<double>(fetchEnd - fetchStart).count();
    if (trace::enabled()) trace::record("data", trace::Track::Compute, fetchStart, fetchEnd, trace::currentStep());
    const bool stepNow = (++micro % tc.accumulateGradBatches == 0) || b == usable - 1;
    at::Tensor loss;
    {
      trace::Scope span("forward");
      loss = s.lossFn(s.model->forward(x), y);
    }
    if (s.join && stepNow) strategy.setContributors(contributorsAt(stepInEpoch));
    {
      trace::Scope span("backward");
      strategy.backward(tc.accumulateGradBatches > 1 ? loss / double(tc.accumulateGradBatches) : loss, stepNow);
    }
    const double stepLoss = loss.item<double>();
    // Before the optimizer steps on it; an isfinite per micro-batch.
    if (!std::isfinite(stepLoss) && tc.stopOnNonfiniteLoss) {
      fail<NonFiniteLossError>("training: loss is {} at epoch {}, step {} (rank {}). HINT: lower optimizer.lr, or set "
                               "training.on_nonfinite_loss=\"continue\"",
                               nonFiniteName(stepLoss), epoch + 1, s.steps + 1, rank());
    }
    lossSum += stepLoss * len;
    seen += len;
    if (stepNow) {
      {
        trace::Scope span("optimizer step");
        strategy.step();
      }
      micro = 0;
      ++s.steps;
      trace::setStep(s.steps + 1);  // the step that runs next
      ++stepInEpoch;
      if (tc.maxSteps > 0 && s.steps >= tc.maxSteps) s.stop = true;
    }
    if (!s.stepCallbacks.empty()) {
      const StepEnd step{epoch, b, usable, stepNow, s.steps, loss};
      for (TrainerCallback* callback : s.stepCallbacks) callback->onStepEnd(*this, step);
    }
    if (s.watchSignals && stepNow && stopSignalAgreed()) {
      s.stop = true;
      s.partialEpoch = b + 1 < usable;
      s.batchesDone = b + 1;
    }
  }
  // This rank's data is used up while its peers still have a step: it
  // shadows it (zero gradients that do not count in the average), then
  // applies the averaged gradients like everyone.
  const int64_t epochSteps = *std::max_element(rankSteps.begin(), rankSteps.end());
  for (int64_t k = std::max(stepInEpoch, stepsOf(myN)); s.join && k < epochSteps && !s.stop; ++k) {
    strategy.setContributors(contributorsAt(k));
    {
      trace::Scope span("shadow backward");
      strategy.shadowBackward();
    }
    {
      trace::Scope span("optimizer step");
      strategy.step();
    }
    ++s.steps;
    trace::setStep(s.steps + 1);
    if (tc.maxSteps > 0 && s.steps >= tc.maxSteps) s.stop = true;
    if (s.watchSignals && stopSignalAgreed()) {
      s.stop = true;
      s.partialEpoch = k + 1 < epochSteps;
      s.batchesDone = usable;
    }
  }
  return {lossSum, double(seen)};
}

std::vector<double> Trainer::evaluate() {
  Impl& s = *impl_;
  torch::NoGradGuard noGrad;
  s.model->eval();
  // Loss sum (each batch's mean times its samples), correct predictions
  // (classes or tokens), samples, squared error, and the units the last two
  // count (tokens for next-token data, values for regression).
  std::vector<double> sums(5, 0.0);
  const auto n = static_cast<int64_t>(s.testRows.size());
  const int64_t step = config_.training.evalBatchSize;
  for (int64_t begin = 0; begin < n; begin += step) {
    const int64_t len = std::min(step, n - begin);
    const Batch batch =
        s.data.test->get(c10::ArrayRef<int64_t>(s.testRows.data() + begin, static_cast<size_t>(len)));
    const at::Tensor x = batch.inputs.to(s.device), y = batch.targets.to(s.device);
    const at::Tensor out = s.model->forward(x);
    sums[0] += s.lossFn(out, y).item<double>() * double(len);
    sums[2] += double(len);
    switch (s.data.task) {
      case Task::Classification:
        sums[1] += out.argmax(1).eq(y).sum().item<double>();
        break;
      case Task::NextToken:
        sums[1] += out.argmax(-1).eq(y).sum().item<double>();
        sums[4] += double(y.numel());
        break;
      case Task::Regression: {
        const at::Tensor diff = out.to(at::kDouble).reshape(y.sizes()) - y.to(at::kDouble);
        sums[3] += diff.pow(2).sum().item<double>();
        sums[4] += double(y.numel());
        break;
      }
    }
  }
  // A strategy whose forward runs collectives (fsdp gathers its units)
  // needs the same number of forwards on every rank: a rank with fewer
  // test rows runs the missing ones on one row, discarded. Rows are dealt
  // rank by rank, so rank 0 has the most: ceil(total / world).
  if (s.strategy->collectiveForward() && s.data.test->size() > 0) {
    const int64_t world = worldSize(), total = s.data.test->size();
    const int64_t most = ((total + world - 1) / world + step - 1) / step;
    const int64_t row = 0;
    for (int64_t k = (n + step - 1) / step; k < most; ++k) {
      s.model->forward(s.data.test->get(c10::ArrayRef<int64_t>(&row, 1)).inputs.to(s.device));
    }
  }
  return sums;
}

void Trainer::saveCheckpoint(int64_t epoch) { writeCheckpoint(epoch, 0, {}); }

// Writes the archive to `path` with write(2), so that a full disk is named
// as such (LibTorch's own file writer reports "unexpected pos"), flushed
// to disk; on failure the file is removed and the error names it.
void Trainer::writeCheckpoint(int64_t epoch, int64_t batch, const std::vector<double>& partial) {
  Impl& s = *impl_;
  std::optional<torch::serialize::OutputArchive> archive;
  if (isWriter()) archive.emplace();
  s.strategy->saveState(archive ? &*archive : nullptr);
  std::string failure;
  if (archive) {
    const std::string dir = options_.runDir + "/checkpoints";
    ::mkdir(dir.c_str(), 0755);
    archive->write("epoch", at::tensor(epoch, at::kLong));
    archive->write("steps", at::tensor(s.steps, at::kLong));
    archive->write("rng", at::detail::getDefaultCPUGenerator().get_state());
    if (batch > 0) {
      archive->write("batch", at::tensor(batch, at::kLong));
      archive->write("partial", at::tensor(partial, at::kDouble));
    }
    const std::string finalPath = dir + "/" + checkpointFileName(epoch, batch);
    const std::string tmpPath = finalPath + ".tmp";
    const int fd = ::open(tmpPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int err = fd < 0 ? errno : 0;
    if (fd >= 0) {
      try {
        // After a failed write the rest is dropped but reported as written:
        // LibTorch's writer throws from its destructor (and so aborts) when
        // told of a short write. The failure is reported below.
        archive->save_to([&](const void* data, size_t n) -> size_t {
          size_t done = 0;
          while (err == 0 && done < n) {
            const ssize_t w = ::write(fd, static_cast<const char*>(data) + done, n - done);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) err = w < 0 ? errno : ENOSPC;
            else done += static_cast<size_t>(w);
          }
          return n;
        });
      } catch (const std::exception& e) {
        if (err == 0) failure = std::string(e.what()).substr(0, std::string(e.what()).find('\n'));
      }
      if (err == 0 && failure.empty() && ::fsync(fd) != 0) err = errno;
      if (::close(fd) != 0 && err == 0 && failure.empty()) err = errno;
    }
    // rename() is atomic: readers see the old checkpoint or the new one, whole.
    if (err == 0 && failure.empty() && std::rename(tmpPath.c_str(), finalPath.c_str()) != 0) err = errno;
    if (err != 0 || !failure.empty()) {
      ::unlink(tmpPath.c_str());
      failure = fmt::format("checkpoint: cannot write {}: {}", finalPath, err != 0 ? errnoText(err) : failure);
    } else {
      s.lastSaved = epoch;
    }
  }
  // The others wait while rank 0 writes; a slow disk gets ten minutes.
  if (worldSize() > 1) group().barrier({std::chrono::milliseconds(600000)})->wait();
  if (!failure.empty()) fail<std::runtime_error>("{}", failure);
}

// Every rank at each optimizer step of a run with checkpoint_on_signal: the
// largest signal number any rank got (0: none), agreed with one allreduce
// of one number, so every rank stops after the same step even when only
// some got the signal.
bool Trainer::stopSignalAgreed() {
  Impl& s = *impl_;
  int64_t signal = gStopSignal.load();
  if (worldSize() > 1) {
    if (!s.signalFlag.defined()) s.signalFlag = at::zeros({1}, at::kLong);
    s.signalFlag.data_ptr<int64_t>()[0] = signal;
    AllreduceOptions max;
    max.op = ReduceOp::Max;
    group().allreduce(s.signalFlag, max)->wait();
    signal = s.signalFlag.data_ptr<int64_t>()[0];
  }
  if (signal != 0) s.signal = static_cast<int>(signal);
  return signal != 0;
}


TrainResult Trainer::run() {
  try {
    return runStages();
  } catch (const std::exception& e) {
    // Once the run folder exists, train.log says why the run ended.
    if (impl_->log) impl_->log->failure(errorLine(e));
    throw;
  }
}

TrainResult Trainer::runStages() {
  build();
  Impl& s = *impl_;
  const auto& tc = config_.training;
  s.log->line(fmt::format("experiment {}: {} train / {} test samples, {} rank(s) x batch {}, {} epochs",
                          config_.name.empty() ? std::string("(unnamed)") : config_.name, s.data.train->size(),
                          s.data.test->size(), worldSize(), tc.batchSize, tc.epochs));
  for (auto& callback : s.callbacks) callback->onTrainBegin(*this);

  TrainResult result;
  const StopSignals signals(tc.checkpointOnSignal);
  s.watchSignals = tc.checkpointOnSignal;
  const auto trainStart = Clock::now();
  s.stop = tc.maxSteps > 0 && s.steps >= tc.maxSteps;
  for (int64_t epoch = s.startEpoch; epoch < tc.epochs && !s.stop; ++epoch) {
    for (auto& callback : s.callbacks) callback->onEpochBegin(*this, epoch);
    const auto epochStart = Clock::now();
    s.dataSeconds = 0;
    const auto [lossSum, seen] = trainEpoch(epoch);
    if (s.partialEpoch) {
      // Stopped by a signal mid-epoch: the epoch's sums so far, over all
      // ranks, go into a checkpoint of this step; its record comes on resume.
      at::Tensor t = at::tensor(std::vector<double>{lossSum, seen}, at::kDouble);
      if (worldSize() > 1) group().allreduce(t)->wait();
      writeCheckpoint(epoch, s.batchesDone, {t[0].item<double>(), t[1].item<double>()});
      s.log->line(fmt::format("signal {}: saved {}/checkpoints/{} (step {}, {} batches into epoch {}); stopping",
                              s.signal, options_.runDir, checkpointFileName(epoch, s.batchesDone), s.steps,
                              s.batchesDone, epoch + 1));
      break;
    }

    const bool lastEpoch = epoch + 1 == tc.epochs || s.stop;
    const bool evaluated = lastEpoch || (tc.evalEvery > 0 && (epoch + 1) % tc.evalEvery == 0);
    std::vector<double> sums = {lossSum, seen, s.dataSeconds};
    if (evaluated) {
      const std::vector<double> test = evaluate();
      sums.insert(sums.end(), test.begin(), test.end());
    }
    // One collective for the train and test sums.
    if (worldSize() > 1) {
      at::Tensor t = at::tensor(sums, at::kDouble);
      group().allreduce(t)->wait();
      sums.assign(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
    }
    EpochMetrics m;
    m.epoch = epoch + 1;
    m.trainLoss = sums[0] / std::max(1.0, sums[1]);
    // The same reduced sum on every rank: all stop together where no step's
    // loss was non-finite but their sum is (it overflowed).
    if (!std::isfinite(m.trainLoss) && tc.stopOnNonfiniteLoss) {
      fail<NonFiniteLossError>("training: the mean loss of epoch {} over all ranks is {} (rank {}). HINT: lower "
                               "optimizer.lr, or set training.on_nonfinite_loss=\"continue\"",
                               epoch + 1, nonFiniteName(m.trainLoss), rank());
    }
    m.dataSeconds = sums[2] / static_cast<double>(worldSize());
    // sums: train loss, train samples, batch assembly seconds, then evaluate()'s five.
    if (evaluated && sums[5] > 0) {
      m.testLoss = sums[3] / sums[5];
      switch (s.data.task) {
        case Task::Classification:
          m.testAccuracy = sums[4] / sums[5];
          break;
        case Task::NextToken:
          m.testPerplexity = std::exp(*m.testLoss);
          if (sums[7] > 0) m.testAccuracy = sums[4] / sums[7];
          break;
        case Task::Regression:
          if (sums[7] > 0) m.testRmse = std::sqrt(sums[6] / sums[7]);
          break;
      }
    }
    {
      const ParallelStrategy::HeldBytes held = s.strategy->heldBytes();
      at::Tensor memory = at::tensor(std::vector<double>{double(held.parameters), double(held.gradients),
                                                         double(held.optimizerState), double(peakResidentBytes())},
                                     at::kDouble);
      if (worldSize() > 1) group().allreduce(memory, {ReduceOp::Max})->wait();
      const double* v = memory.data_ptr<double>();
      m.parameterBytes = static_cast<int64_t>(v[0]);
      m.gradientBytes = static_cast<int64_t>(v[1]);
      m.optimizerBytes = static_cast<int64_t>(v[2]);
      m.peakRssBytes = static_cast<int64_t>(v[3]);
    }
    m.seconds = std::chrono::duration<double>(Clock::now() - epochStart).count();

    EpochEnd end{m, evaluated, lastEpoch};
    for (auto& callback : s.callbacks) callback->onEpochEnd(*this, end);
    if (s.signal != 0) {
      if (s.lastSaved != epoch + 1) saveCheckpoint(epoch + 1);
      s.log->line(fmt::format("signal {}: saved {}/checkpoints/{} (step {}, end of epoch {}); stopping", s.signal,
                              options_.runDir, checkpointFileName(epoch + 1), s.steps, epoch + 1));
    }
    result.history.push_back(std::move(m));
  }
  for (auto& callback : s.callbacks) callback->onTrainEnd(*this);
  result.signal = s.signal;
  result.steps = s.steps;
  result.loopSeconds = std::chrono::duration<double>(Clock::now() - trainStart).count();
  s.strategy->withFullParameters([&] {
    for (const auto& p : s.model->parameters()) result.finalParameters.push_back(p.detach().clone());
  });
  return result;
}

std::string errorLine(const std::exception& e) {
  const auto* torchError = dynamic_cast<const c10::Error*>(&e);
  std::string what = torchError ? torchError->what_without_backtrace() : e.what();
  while (!what.empty() && (what.back() == '\n' || what.back() == ' ')) what.pop_back();
  for (char& c : what) {
    if (c == '\n') c = ' ';
  }
  return what;
}

TrainResult runTraining(const ExperimentConfig& config, const DistributedContext& dist, const RunOptions& options,
                        PluginRegistry& registry) {
  Trainer trainer(config, dist, options, registry);
  trainer.addStandardCallbacks();
  return trainer.run();
}

}  // namespace ddp
