#include "framework/experiment/trainer.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <torch/cuda.h>

#include <algorithm>
#include <cmath>

#include "framework/core/compute_threads.hpp"
#include "framework/core/errors.hpp"
#include "framework/core/system.hpp"
#include "framework/experiment/callbacks/best_checkpoints.hpp"
#include "framework/experiment/callbacks/checkpoints.hpp"
#include "framework/experiment/callbacks/early_stopping.hpp"
#include "framework/experiment/callbacks/epoch_log.hpp"
#include "framework/experiment/callbacks/fault_injection.hpp"
#include "framework/experiment/callbacks/metrics_files.hpp"
#include "framework/experiment/callbacks/progress_line.hpp"
#include "framework/experiment/callbacks/step_metrics.hpp"
#include "framework/experiment/callbacks/tensorboard_log.hpp"
#include "framework/experiment/callbacks/trace_writer.hpp"
#include "framework/experiment/trainer_impl.hpp"
#include "framework/comm/sub_groups.hpp"
#include "framework/interop/weights_file.hpp"
#include "framework/launch/stop_signals.hpp"

namespace ddp {

Trainer::Trainer(const ExperimentConfig& config, const DistributedContext& dist, const RunOptions& options,
                 PluginRegistry& registry)
    : config_(config), dist_(dist), options_(options), registry_(registry), impl_(std::make_unique<Impl>()) {
  impl_->group = dist_.group;
}

Trainer::~Trainer() = default;

// A joiner has no group until it is admitted (elastic): no rank yet.
int Trainer::rank() const { return impl_->group ? impl_->group->rank() : -1; }
int Trainer::worldSize() const { return impl_->group ? impl_->group->size() : 0; }
int64_t Trainer::generation() const { return impl_->membership.generation; }
bool Trainer::writesEpochRecords() const {
  if (!isWriter()) return false;
  if (!impl_->rendezvous) return true;
  try {
    return !impl_->rendezvous->superseded(impl_->membership);
  } catch (const std::exception&) {
    return true;  // the store unreachable for a moment: the collectives decide
  }
}
void Trainer::writeTakenOverRecords(EpochEnd& end, size_t count) {
  Impl& s = *impl_;
  for (size_t j = 0; j < count && j < s.callbacks.size(); ++j) {
    if (s.callbacks[j]->writerOnly()) s.callbacks[j]->onEpochEnd(*this, end);
  }
}

ProcessGroup& Trainer::group() const {
  DDP_CHECK(impl_->group != nullptr, "Trainer::group() before this rank joined");
  return *impl_->group;
}
ProcessGroupPtr Trainer::groupPtr() const { return impl_->group; }
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
  if (auto slow = SlowRank::fromEnvironment(rank())) addCallback(slow);
  if (options_.minRanks > 0) {
    if (auto await = AwaitJoin::fromEnvironment()) addCallback(await);
  }
  if (ProgressLine::wanted(*this)) addCallback(std::make_shared<ProgressLine>(ProgressLine::terminal()));
  // Every rank (one collective per epoch), before the metrics files that
  // write what it adds.
  // training.tensorboard: the records below also go to an event file.
  std::shared_ptr<TensorBoardLog> tensorboard;
  if (config_.training.tensorboard && (isWriter() || options_.minRanks > 0)) {
    tensorboard = std::make_shared<TensorBoardLog>();
    addCallback(tensorboard);
  }
  addCallback(std::make_shared<StepMetrics>(tensorboard));
  // After the step's record: a rank killed after step S leaves S's record.
  if (auto fault = FaultInjection::fromEnvironment(rank(), dist_.store)) addCallback(fault);
  // Every rank (it gathers the ranks' spans).
  // Not in elastic runs: the ranks whose spans it gathers may change.
  if (options_.minRanks == 0 && TraceWriter::wanted(*this)) addCallback(std::make_shared<TraceWriter>());
  // Elastic runs add them on every rank: rank 0 of the current membership
  // writes, and the writer may change when a rank leaves.
  if (isWriter() || options_.minRanks > 0) {
    addCallback(std::make_shared<MetricsFiles>(tensorboard));
    addCallback(std::make_shared<EpochLog>());
  }
  // Every rank (rank 0 decides, the others follow), after the epoch's log
  // line and before the periodic checkpoint, which an early stop makes the
  // last one.
  if (config_.training.keepBest > 0) addCallback(std::make_shared<BestCheckpoints>());
  if (config_.training.earlyStopping) addCallback(std::make_shared<EarlyStopping>());
  if (config_.training.saveEvery > 0) addCallback(std::make_shared<PeriodicCheckpoints>(config_.training.saveEvery));
}

void Trainer::build() {
  if (impl_->built) return;
  Impl& s = *impl_;
  const auto& tc = config_.training;
  const ExperimentConfig& config = config_;
  PluginRegistry& registry = registry_;
  if (tc.threads > 0) setComputeThreads(static_cast<int>(tc.threads));

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

  if (options_.minRanks > 0) {
    // Before the plugins are built (a dataset may take a while): the
    // heartbeat starts now, so that the others see this member alive.
    ElasticOptions eo;
    eo.minRanks = options_.minRanks;
    eo.maxId = dist_.env.worldSize;
    // A member still beating is waited for the timeout and a quarter more
    // (2 s at least): one that got through a collective the others failed
    // fails its next one up to a whole timeout later, then arrives (on a
    // busy machine, not at once). A hung one is left out after that.
    const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(config.distributed.timeoutSeconds * 1000));
    eo.settle = timeout + std::max<std::chrono::milliseconds>(std::chrono::seconds(2), timeout / 4);
    eo.decisionTimeout = eo.settle * 2;
    s.rendezvous = std::make_unique<ElasticRendezvous>(dist_.store, dist_.env.rank, eo);
  }

  trainer_detail::BuiltPlugins built = trainer_detail::buildPlugins(config, registry, s.device, /*checkFit=*/true);
  s.data = std::move(built.data);
  s.model = std::move(built.model);
  s.scheduler = std::move(built.scheduler);
  s.lossFn = std::move(built.lossFn);
  std::unique_ptr<torch::optim::Optimizer> optimizer = std::move(built.optimizer);
  DatasetSplits& data = s.data;
  ModelPtr& model = s.model;
  for (auto& g : optimizer->param_groups()) s.baseLrs.push_back(g.options().get_lr());
  s.precision = parsePrecision(tc.precision);
  if (config.scheduler) s.warmupSteps = config.scheduler->params.json().value("warmup_steps", int64_t{0});

  if (s.rendezvous && !options_.elasticJoin) s.membership = s.rendezvous->initial(dist_.env.worldSize);
  if (options_.elasticJoin) {
    // A process that replaces a lost rank: no run folder of its own to make
    // or resume; the state comes from a peer.
    s.log = std::make_unique<RunLog>(false, options_.runDir, options_.quiet);
    joinRunningJob(std::move(optimizer));
    s.built = true;
    return;
  }

  // model.init_from: every rank reads the same weights (a file that does
  // not fit fails on every rank, before a run folder exists); a checkpoint
  // to resume from replaces them below.
  const std::string initFrom = config.model.params.json().value("init_from", std::string());
  size_t initTensors = 0;
  if (!initFrom.empty()) {
    const NamedTensors weights = readWeightsFile(initFrom).tensors;
    loadModuleState(*model, weights, fmt::format("model.init_from {}", initFrom));
    initTensors = weights.size();
  }

  // Rank 0 takes the run folder and decides what every rank resumes from;
  // the others learn it through the store, or that rank 0 refused.
  std::vector<std::string> notes;  // for train.log, once it is open
  std::string resumeFrom;
  trainer_detail::CheckpointState state;
  if (isWriter()) {
    const auto share = [&](const std::string& value) {
      if (worldSize() > 1 && dist_.store) dist_.store->setString(trainer_detail::kStartKey, value);
    };
    try {
      resumeFrom = trainer_detail::prepareRunFolder(config, options_, *model, *optimizer, &notes, &state, &s.lock, data.runFiles);
    } catch (const UsageError& e) {
      share(std::string("usage:") + e.what());
      throw;
    } catch (const std::exception& e) {
      share(std::string("error:") + e.what());
      throw;
    }
    share("ok:" + resumeFrom);
  } else if (worldSize() > 1 && dist_.store) {
    const std::string start = dist_.store->getString(trainer_detail::kStartKey);
    if (start.rfind("usage:", 0) == 0) fail<UsageError>("rank 0 did not start the run: {}", start.substr(6));
    if (start.rfind("error:", 0) == 0) fail<std::runtime_error>("rank 0 did not start the run: {}", start.substr(6));
    resumeFrom = start.substr(3);
    if (!resumeFrom.empty()) state = trainer_detail::loadCheckpoint(resumeFrom, *model, *optimizer);
  }
  s.log = std::make_unique<RunLog>(isWriter(), options_.runDir, options_.quiet);
  for (const std::string& note : notes) s.log->line(note);
  if (!resumeFrom.empty()) {
    s.startEpoch = state.epoch;
    s.steps = state.steps;
    s.resumeBatch = state.batch;
    // Mid-epoch, at the world size that saved it: on from its batch count,
    // in the order of an unbroken run. At another world size (or after an
    // elastic run, whose membership may have changed within the epoch):
    // the samples of the epoch not read yet, dealt over this world.
    const bool otherWorld = state.batch > 0 && (state.elastic || state.worldSize != worldSize());
    s.consumed = otherWorld ? state.consumed : 0;
    if (isWriter()) s.resumeSums = state.partial;
    std::string line = state.batch > 0 ? fmt::format("resumed from {} after epoch {} and {} batches of epoch {}",
                                                     resumeFrom, state.epoch, state.batch, state.epoch + 1)
                                       : fmt::format("resumed from {} after epoch {}", resumeFrom, state.epoch);
    if (otherWorld && !state.elastic) {
      line += fmt::format(" (saved at world size {}; the {} samples of epoch {} not read yet are dealt over {} ranks)",
                          state.worldSize, std::max<int64_t>(0, trainSamples() - state.consumed),
                          state.epoch + 1, worldSize());
    }
    s.log->line(line);
  } else if (options_.resume) {
    s.log->line(fmt::format("resume: no checkpoint in {}/checkpoints; starting from scratch", options_.runDir));
  }
  if (resumeFrom.empty() && !initFrom.empty()) {
    s.log->line(fmt::format("model: started from the {} tensors of {} (model.init_from)", initTensors, initFrom));
  }

  makeStrategy(optimizer);
  if (!resumeFrom.empty() && state.sharded) loadShardedState(resumeFrom);
  shardData();
  s.built = true;
}

void Trainer::makeStrategy(std::unique_ptr<torch::optim::Optimizer>& optimizer, bool statesEqual) {
  Impl& s = *impl_;
  StrategyContext context;
  context.optimizer = std::move(optimizer);
  try {
    buildStrategy(context, statesEqual);
  } catch (...) {
    if (context.optimizer) optimizer = std::move(context.optimizer);
    throw;
  }
  s.strategy->setGradientClipping(config_.training.clipGradNorm);
}

void Trainer::buildStrategy(StrategyContext& context, bool statesEqual) {
  Impl& s = *impl_;
  const ExperimentConfig& config = config_;
  context.model = s.model;
  context.group = s.group;
  context.ddp.bucketCapBytes = static_cast<size_t>(config.distributed.bucketCapMb * 1024 * 1024);
  context.ddp.firstBucketCapBytes = static_cast<size_t>(config.distributed.firstBucketCapMb * 1024 * 1024);
  context.ddp.findUnusedParameters = config.distributed.findUnusedParameters;
  context.ddp.statesEqual = statesEqual;
  if (config.distributed.commHook) {
    const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(config.distributed.timeoutSeconds * 1000));
    context.ddp.commHook = registry_.get(PluginKind::CommHook, config.distributed.commHook->name)
                               .commHook(config.distributed.commHook->params, timeout);
  }
  context.fsdp.backwardPrefetch = config.distributed.fsdpBackwardPrefetch;
  context.fsdp.unitBytes = static_cast<int64_t>(config.distributed.fsdpUnitMb * 1024 * 1024);
  if (config.distributed.strategy == "hsdp") {
    // Rows of `shard` ranks shard the model; columns replicate it.
    const int world = worldSize();
    const int shard = static_cast<int>(config.distributed.shardSize > 0 ? config.distributed.shardSize
                                                                         : std::max(1, dist_.env.localWorldSize));
    if (world % shard != 0) {
      fail<UsageError>("distributed.shard_size: {} does not divide the world size {}. HINT: --set "
                       "distributed.shard_size=N with N a divisor of {} (0: the ranks of one node)",
                       shard, world, world);
    }
    if (world == 1) {
      context.replicateGroup = s.group;
    } else {
      if (!dist_.store || !dist_.backends) {
        fail<UsageError>("strategy hsdp: this distributed context cannot make sub-groups (no store or backends)");
      }
      GroupFactory groups(dist_.store, *dist_.backends, dist_.backend, rank(), world, dist_.groupOptions);
      RankMesh mesh = groups.mesh(world / shard, shard);
      context.group = mesh.shardGroup;
      context.replicateGroup = mesh.replicateGroup;
      s.log->line(fmt::format("hsdp: {} row(s) of {} rank(s) each shard the model; ranks r, r+{}, ... hold the same "
                              "shard",
                              world / shard, shard, shard));
    }
  }
  s.strategy = builtinStrategies().create(config.distributed.strategy, std::move(context));
}

void Trainer::shardData() {
  Impl& s = *impl_;
  const auto& tc = config_.training;
  const DatasetSplits& data = s.data;
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
  s.testRows.clear();
  for (int64_t i = r; i < data.test->size(); i += world) s.testRows.push_back(i);
}

void Trainer::requestStop(const std::string& reason) {
  Impl& s = *impl_;
  s.stop = true;
  s.stopReason = reason;
  s.log->line(reason);
}

TrainResult Trainer::run() {
  try {
    return runStages();
  } catch (const std::exception& e) {
    // Once the run folder exists, train.log says why the run ended; not a
    // writer left out of an elastic job, which goes on without it.
    if (impl_->log && dynamic_cast<const ElasticExcluded*>(&e) == nullptr) impl_->log->failure(errorLine(e));
    throw;
  }
}

TrainResult Trainer::runStages() {
  build();
  Impl& s = *impl_;
  const auto& tc = config_.training;
  if (options_.resume && s.startEpoch >= tc.epochs) {
    s.log->line(fmt::format("resume: the run in {} has finished its {} epoch(s); nothing to train. HINT: --set "
                            "training.epochs={} (or more) trains it further",
                            options_.runDir, tc.epochs, tc.epochs + 1));
  } else if (options_.resume && tc.maxSteps > 0 && s.steps >= tc.maxSteps) {
    s.log->line(fmt::format("resume: the run in {} has reached training.max_steps {}; nothing to train. HINT: raise "
                            "training.max_steps to train it further",
                            options_.runDir, tc.maxSteps));
  }
  s.log->line(fmt::format("experiment {}: {} train / {} test samples, {} rank(s) x batch {}, {} epochs{}",
                          config_.name.empty() ? std::string("(unnamed)") : config_.name, s.data.train->size(),
                          s.data.test->size(), worldSize(), tc.batchSize, tc.epochs,
                          tc.maxSteps > 0 ? fmt::format(" (at most {} steps: training.max_steps)", tc.maxSteps)
                                          : std::string()));
  for (auto& callback : s.callbacks) callback->onTrainBegin(*this);

  TrainResult result;
  // One rank stops at a step boundary on SIGINT or SIGTERM whatever the
  // setting, to say so in train.log; several ranks only with
  // checkpoint_on_signal (they agree on the step: one allreduce per step).
  const bool interruptible = tc.checkpointOnSignal || (worldSize() == 1 && options_.minRanks == 0);
  const trainer_detail::StopSignals signals(interruptible);
  s.watchSignals = interruptible;
  const auto trainStart = trainer_detail::Clock::now();
  s.stop = tc.maxSteps > 0 && s.steps >= tc.maxSteps;
  for (int64_t epoch = s.startEpoch; epoch < tc.epochs && !s.stop; ++epoch) {
    for (auto& callback : s.callbacks) callback->onEpochBegin(*this, epoch);
    const auto epochStart = trainer_detail::Clock::now();
    s.dataSeconds = 0;
    const auto [lossSum, seen] = trainEpoch(epoch);
    if (s.signal != 0 && !tc.checkpointOnSignal) {
      s.log->line(fmt::format("interrupted by {} at step {} (epoch {}); no checkpoint saved. HINT: "
                              "training.checkpoint_on_signal=true saves one to --resume from",
                              signalName(s.signal), s.steps, epoch + 1));
      break;
    }
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
    // Evaluation, then the epoch's sums (added) and the memory held (the
    // largest), over the ranks in one collective: an elastic run that loses
    // a rank here evaluates again over the new membership (the lost rank's
    // training samples then count in no train loss). One collective, so
    // that no member can be past it while another recovers from it.
    std::vector<double> sums, memory;
    for (;;) {
      try {
        sums = {lossSum, seen, s.dataSeconds};
        if (evaluated) {
          const std::vector<double> test = evaluate();
          sums.insert(sums.end(), test.begin(), test.end());
        }
        const ParallelStrategy::HeldBytes held = s.strategy->heldBytes();
        memory = {double(held.parameters), double(held.gradients), double(held.optimizerState),
                  double(peakResidentBytes())};
        if (worldSize() > 1) {
          std::vector<double> mine = sums;
          mine.insert(mine.end(), memory.begin(), memory.end());
          const at::Tensor in = at::tensor(mine, at::kDouble);
          at::Tensor all = at::empty({worldSize() * in.numel()}, at::kDouble);
          group().allgather(in, all)->wait();
          const double* v = all.data_ptr<double>();
          const size_t n = mine.size();
          for (size_t i = 0; i < sums.size(); ++i) {
            sums[i] = 0;
            for (int r = 0; r < worldSize(); ++r) sums[i] += v[r * n + i];
          }
          for (size_t i = 0; i < memory.size(); ++i) {
            for (int r = 0; r < worldSize(); ++r) memory[i] = std::max(memory[i], v[r * n + sums.size() + i]);
          }
        }
        break;
      } catch (const std::exception& e) {
        if (!recoverable(e)) throw;
        recover(errorLine(e));
      }
    }
    EpochMetrics m;
    m.epoch = epoch + 1;
    m.trainLoss = sums[0] / std::max(1.0, sums[1]);
    // The same reduced sum on every rank: all stop together where no step's
    // loss was non-finite but their sum is (it overflowed).
    if (!std::isfinite(m.trainLoss) && tc.stopOnNonfiniteLoss) {
      fail<NonFiniteLossError>("training: the mean loss of epoch {} over all ranks is {} (rank {}). HINT: lower "
                               "optimizer.lr, or set training.on_nonfinite_loss=\"continue\"",
                               epoch + 1, trainer_detail::nonFiniteName(m.trainLoss), rank());
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
      const double* v = memory.data();
      m.parameterBytes = static_cast<int64_t>(v[0]);
      m.gradientBytes = static_cast<int64_t>(v[1]);
      m.optimizerBytes = static_cast<int64_t>(v[2]);
      m.peakRssBytes = static_cast<int64_t>(v[3]);
    }
    m.seconds = std::chrono::duration<double>(trainer_detail::Clock::now() - epochStart).count();

    EpochEnd end{m, evaluated, lastEpoch};
    for (size_t i = 0, retries = 0; i < s.callbacks.size(); ++i) {
      try {
        s.callbacks[i]->onEpochEnd(*this, end);
      } catch (const std::exception& e) {
        // Elastic: a rank lost in a callback's collective (the straggler
        // report, a checkpoint's barrier, early stopping's broadcast): the
        // members recover and that callback runs again, over the new
        // group. The callbacks before it are not repeated, except the
        // writer's records on a rank that has just become the writer: the
        // lost writer may have gone before it wrote them.
        if (!recoverable(e) || ++retries > 10) throw;
        if (recover(errorLine(e))) writeTakenOverRecords(end, i);
        --i;
        continue;
      }
      if (s.stop) end.lastEpoch = true;  // requestStop(): what follows sees the run's last epoch
    }
    if (s.rendezvous) {
      s.lastEpochEnd = m;
      s.lastEpochEvaluated = end.evaluated;
      s.lastEpochLast = end.lastEpoch;
    }
    if (s.signal != 0) {
      if (s.lastSaved != epoch + 1) saveCheckpoint(epoch + 1);
      s.log->line(fmt::format("signal {}: saved {}/checkpoints/{} (step {}, end of epoch {}); stopping", s.signal,
                              options_.runDir, checkpointFileName(epoch + 1), s.steps, epoch + 1));
    }
    result.history.push_back(std::move(m));
  }
  // The last periodic checkpoint is whole before the run ends.
  if (s.asyncWriter) s.asyncWriter->wait();
  // No step boundary is left to admit a joiner at.
  if (s.rendezvous) s.rendezvous->finish();
  for (auto& callback : s.callbacks) callback->onTrainEnd(*this);
  result.signal = s.signal;
  result.stopReason = s.stopReason;
  result.group = s.group;
  result.recoveries = s.recoveries;
  result.steps = s.steps;
  result.loopSeconds = std::chrono::duration<double>(trainer_detail::Clock::now() - trainStart).count();
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
