#include "framework/experiment/trainer.hpp"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "framework/core/errors.hpp"
#include "framework/core/system.hpp"
#include "framework/experiment/callbacks/checkpoints.hpp"
#include "framework/experiment/callbacks/epoch_log.hpp"
#include "framework/experiment/callbacks/fault_injection.hpp"
#include "framework/experiment/callbacks/metrics_files.hpp"
#include "framework/experiment/callbacks/progress_line.hpp"
#include "framework/experiment/run_log.hpp"
#include "framework/parallel/sampler.hpp"
#include "framework/parallel/strategy.hpp"

namespace ddp {
namespace {

using Clock = std::chrono::steady_clock;

// One epoch's sample order, and batches of rows taken from it. A CPU
// tensor that is contiguous is gathered with one memcpy per row into a fresh
// tensor: cheaper, for a small batch, than an index tensor and index_select.
// Anything else (another device, other strides) goes through index_select
// with the epoch's order uploaded once.
class BatchGather {
 public:
  explicit BatchGather(std::vector<int64_t> order) : order_(std::move(order)) {}

  int64_t size() const { return static_cast<int64_t>(order_.size()); }

  at::Tensor rows(const at::Tensor& src, int64_t begin, int64_t n) {
    if (src.device().is_cpu() && src.layout() == at::kStrided && src.is_contiguous() && !src.requires_grad() &&
        src.dim() >= 1) {
      std::vector<int64_t> shape(src.sizes().begin(), src.sizes().end());
      shape[0] = n;
      at::Tensor out = at::empty(shape, src.options());
      const size_t rowBytes = static_cast<size_t>(src.stride(0)) * src.element_size();
      const auto* from = static_cast<const char*>(src.data_ptr());
      auto* to = static_cast<char*>(out.data_ptr());
      const int64_t available = src.size(0);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t row = order_[static_cast<size_t>(begin + i)];
        TORCH_CHECK(row >= 0 && row < available, "sample index ", row, " out of range for ", available, " rows");
        std::memcpy(to + static_cast<size_t>(i) * rowBytes, from + static_cast<size_t>(row) * rowBytes, rowBytes);
      }
      return out;
    }
    if (!uploaded_.defined() || uploaded_.device() != src.device()) {
      uploaded_ = at::from_blob(order_.data(), {size()}, at::kLong).clone().to(src.device());
    }
    return src.index_select(0, uploaded_.narrow(0, begin, n));
  }

 private:
  std::vector<int64_t> order_;
  at::Tensor uploaded_;
};

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
void checkPluginsFit(const ExperimentConfig& config, const DatasetSplits& data, Model& model, const LossFn& lossFn) {
  const int64_t rows = std::min<int64_t>(2, data.trainFeatures.size(0));
  if (rows == 0) return;
  const at::Tensor x = data.trainFeatures.narrow(0, 0, rows);
  const at::Tensor y = data.trainTargets.narrow(0, 0, rows);
  const std::string task = data.numClasses > 0 ? fmt::format("classification, {} classes", data.numClasses)
                                                : std::string("regression");
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

std::string newestCheckpoint(const std::string& runDir) {
  const std::string dir = runDir + "/checkpoints";
  DIR* d = ::opendir(dir.c_str());
  if (!d) return "";
  std::string best;
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name.rfind("epoch_", 0) == 0 && name.size() > 3 && name.substr(name.size() - 3) == ".pt" && name > best) {
      best = name;
    }
  }
  ::closedir(d);
  return best.empty() ? "" : dir + "/" + best;
}

namespace {

// Every rank, before the strategy exists: model and optimizer state, RNG
// and step count; returns the epoch.
int64_t loadCheckpoint(const std::string& path, torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                       int64_t* stepsOut) {
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(path);
  } catch (const std::exception& e) {
    fail<std::runtime_error>("checkpoint {} cannot be read: {}", path, e.what());
  }
  loadModelAndOptimizer(archive, model, optimizer);
  at::Tensor epoch, steps, rng;
  archive.read("epoch", epoch);
  archive.read("steps", steps);
  archive.read("rng", rng);
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  generator.set_state(rng);
  *stepsOut = steps.item<int64_t>();
  return epoch.item<int64_t>();
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
  at::Tensor testX, testY;  // this rank's shard of the test split
  int64_t startEpoch = 0;
  int64_t steps = 0;
  bool stop = false;  // training.max_steps reached
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
int64_t Trainer::steps() const { return impl_->steps; }

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
  if (ProgressLine::wanted(*this)) addCallback(std::make_shared<ProgressLine>());
  if (isWriter()) {
    addCallback(std::make_shared<MetricsFiles>());
    addCallback(std::make_shared<EpochLog>());
  }
  if (config_.training.saveEvery > 0) addCallback(std::make_shared<PeriodicCheckpoints>(config_.training.saveEvery));
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

  // Same seed on every rank: the same split and the same initial weights
  // (DDP broadcasts rank 0's anyway).
  torch::manual_seed(tc.seed);
  DatasetContext dctx{tc.seed, config.configDir};
  DatasetSplits& data = s.data;
  data = building("dataset", config.dataset.name, [&] {
    return registry.get(PluginKind::Dataset, config.dataset.name).dataset(config.dataset.params, dctx);
  });
  ModelPtr& model = s.model;
  model = building("model", config.model.name, [&] {
    return registry.get(PluginKind::Model, config.model.name).model(config.model.params, modelContextFor(data));
  });
  if (s.device.is_cuda()) {
    model->to(s.device);
    data.trainFeatures = data.trainFeatures.to(s.device);
    data.trainTargets = data.trainTargets.to(s.device);
    data.testFeatures = data.testFeatures.to(s.device);
    data.testTargets = data.testTargets.to(s.device);
  }
  auto optimizer = building("optimizer", config.optimizer.name, [&] {
    return registry.get(PluginKind::Optimizer, config.optimizer.name)
        .optimizer(model->parameters(), config.optimizer.params);
  });
  if (config.scheduler) {
    s.scheduler = building("scheduler", config.scheduler->name, [&] {
      return registry.get(PluginKind::Scheduler, config.scheduler->name).scheduler(config.scheduler->params);
    });
  }
  s.lossFn = building("loss", config.loss.name,
                      [&] { return registry.get(PluginKind::Loss, config.loss.name).loss(config.loss.params); });
  checkPluginsFit(config, data, *model, s.lossFn);
  for (auto& g : optimizer->param_groups()) s.baseLrs.push_back(g.options().get_lr());

  if (isWriter()) {
    makeRunFolder(options_.runDir);
    if (!config.resolved.is_null()) std::ofstream(options_.runDir + "/config.json") << config.resolved.dump(2) << "\n";
  }
  s.log = std::make_unique<RunLog>(isWriter(), options_.runDir, options_.quiet);

  if (options_.resume) {
    const std::string path = newestCheckpoint(options_.runDir);
    if (!path.empty()) {
      s.startEpoch = loadCheckpoint(path, *model, *optimizer, &s.steps);
      s.log->line(fmt::format("resumed from {} after epoch {}", path, s.startEpoch));
    } else {
      s.log->line(fmt::format("resume: no checkpoint in {}/checkpoints; starting from scratch", options_.runDir));
    }
  }

  StrategyContext context;
  context.model = model;
  context.optimizer = std::move(optimizer);
  context.group = dist_.group;
  context.ddp.bucketCapBytes = static_cast<size_t>(config.distributed.bucketCapMb * 1024 * 1024);
  context.ddp.firstBucketCapBytes = static_cast<size_t>(config.distributed.firstBucketCapMb * 1024 * 1024);
  context.ddp.findUnusedParameters = config.distributed.findUnusedParameters;
  s.strategy = builtinStrategies().create(config.distributed.strategy, std::move(context));

  const int r = rank(), world = worldSize();
  s.sampler = std::make_unique<DistributedSampler>(data.trainFeatures.size(0), r, world, tc.seed, /*shuffle=*/true,
                                                   tc.dropLast);
  s.sampler->setEpoch(s.startEpoch);

  // The test split, sharded: rank r evaluates rows r, r+w, ...; sums are reduced.
  const int64_t testN = data.testFeatures.size(0);
  at::Tensor testRows = at::arange(r, std::max<int64_t>(testN, r), world, at::kLong).to(s.device);
  s.testX = data.testFeatures.index_select(0, testRows);
  s.testY = data.testTargets.index_select(0, testRows);
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
  BatchGather batch(s.sampler->nextEpoch());
  const int64_t myN = batch.size();
  double lossSum = 0;
  int64_t seen = 0;
  const int64_t batches = (myN + tc.batchSize - 1) / tc.batchSize;
  const int64_t usable = tc.dropLast ? myN / tc.batchSize : batches;
  int64_t micro = 0;
  for (int64_t b = 0; b < usable && !s.stop; ++b) {
    const int64_t begin = b * tc.batchSize, len = std::min(tc.batchSize, myN - begin);
    at::Tensor x = batch.rows(data.trainFeatures, begin, len);
    at::Tensor y = batch.rows(data.trainTargets, begin, len);
    const bool stepNow = (++micro % tc.accumulateGradBatches == 0) || b == usable - 1;
    at::Tensor loss = s.lossFn(s.model->forward(x), y);
    strategy.backward(tc.accumulateGradBatches > 1 ? loss / double(tc.accumulateGradBatches) : loss, stepNow);
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
      strategy.step();
      micro = 0;
      ++s.steps;
      if (tc.maxSteps > 0 && s.steps >= tc.maxSteps) s.stop = true;
    }
    if (!s.stepCallbacks.empty()) {
      const StepEnd step{epoch, b, usable, stepNow, s.steps, loss};
      for (TrainerCallback* callback : s.stepCallbacks) callback->onStepEnd(*this, step);
    }
  }
  return {lossSum, double(seen)};
}

std::vector<double> Trainer::evaluate() {
  Impl& s = *impl_;
  torch::NoGradGuard noGrad;
  s.model->eval();
  double testLoss = 0, correct = 0;
  if (s.testX.size(0) > 0) {
    at::Tensor out = s.model->forward(s.testX);
    testLoss = s.lossFn(out, s.testY).item<double>() * s.testX.size(0);
    if (s.data.numClasses > 0) correct = out.argmax(1).eq(s.testY).sum().item<double>();
  }
  return {testLoss, correct, double(s.testX.size(0))};
}

void Trainer::saveCheckpoint(int64_t epoch) {
  Impl& s = *impl_;
  std::optional<torch::serialize::OutputArchive> archive;
  if (isWriter()) archive.emplace();
  s.strategy->saveState(archive ? &*archive : nullptr);
  if (archive) {
    const std::string dir = options_.runDir + "/checkpoints";
    ::mkdir(dir.c_str(), 0755);
    archive->write("epoch", at::tensor(epoch, at::kLong));
    archive->write("steps", at::tensor(s.steps, at::kLong));
    archive->write("rng", at::detail::getDefaultCPUGenerator().get_state());
    const std::string finalPath = fmt::format("{}/epoch_{:06}.pt", dir, epoch);
    const std::string tmpPath = finalPath + ".tmp";
    archive->save_to(tmpPath);
    // rename() is atomic: readers see the old checkpoint or the new one, whole.
    if (std::rename(tmpPath.c_str(), finalPath.c_str()) != 0) {
      fail<std::runtime_error>("checkpoint: cannot rename {} to {}: {}", tmpPath, finalPath, errnoText(errno));
    }
  }
  // The others wait while rank 0 writes; a slow disk gets ten minutes.
  if (worldSize() > 1) group().barrier({std::chrono::milliseconds(600000)})->wait();
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
                          config_.name.empty() ? std::string("(unnamed)") : config_.name,
                          s.data.trainFeatures.size(0), s.data.testFeatures.size(0), worldSize(), tc.batchSize,
                          tc.epochs));
  for (auto& callback : s.callbacks) callback->onTrainBegin(*this);

  TrainResult result;
  const auto trainStart = Clock::now();
  s.stop = tc.maxSteps > 0 && s.steps >= tc.maxSteps;
  for (int64_t epoch = s.startEpoch; epoch < tc.epochs && !s.stop; ++epoch) {
    for (auto& callback : s.callbacks) callback->onEpochBegin(*this, epoch);
    const auto epochStart = Clock::now();
    const auto [lossSum, seen] = trainEpoch(epoch);

    const bool lastEpoch = epoch + 1 == tc.epochs || s.stop;
    const bool evaluated = lastEpoch || (tc.evalEvery > 0 && (epoch + 1) % tc.evalEvery == 0);
    std::vector<double> sums = {lossSum, seen};
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
    if (evaluated && sums[4] > 0) {
      m.testLoss = sums[2] / sums[4];
      if (s.data.numClasses > 0) m.testAccuracy = sums[3] / sums[4];
    }
    m.seconds = std::chrono::duration<double>(Clock::now() - epochStart).count();

    EpochEnd end{m, evaluated, lastEpoch};
    for (auto& callback : s.callbacks) callback->onEpochEnd(*this, end);
    result.history.push_back(std::move(m));
  }
  for (auto& callback : s.callbacks) callback->onTrainEnd(*this);
  result.steps = s.steps;
  result.loopSeconds = std::chrono::duration<double>(Clock::now() - trainStart).count();
  for (const auto& p : s.model->parameters()) result.finalParameters.push_back(p.detach().clone());
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
