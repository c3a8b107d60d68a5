#include "framework/experiment/trainer.hpp"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <algorithm>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "framework/parallel/ddp.hpp"
#include "framework/core/errors.hpp"
#include "framework/parallel/sampler.hpp"
#include "framework/parallel/torch_compat.hpp"

namespace ddp {
namespace {

using Clock = std::chrono::steady_clock;

// Rank 0's log: train.log in the run folder, and stdout unless quiet.
class RunLog {
 public:
  RunLog(bool enabled, const std::string& runDir, bool quiet) : enabled_(enabled), quiet_(quiet) {
    if (enabled_) file_.open(runDir + "/train.log", std::ios::app);
  }
  void line(const std::string& text) {
    if (!enabled_) return;
    file_ << text << "\n";
    file_.flush();
    if (!quiet_) std::cout << text << std::endl;
  }

 private:
  bool enabled_;
  bool quiet_;
  std::ofstream file_;
};

std::string checkpointName(int64_t epoch) {
  char name[64];
  std::snprintf(name, sizeof(name), "epoch_%06lld.pt", static_cast<long long>(epoch));
  return name;
}

void saveCheckpoint(const std::string& runDir, int64_t epoch, int64_t steps, torch::nn::Module& model,
                    torch::optim::Optimizer& optimizer) {
  const std::string dir = runDir + "/checkpoints";
  ::mkdir(dir.c_str(), 0755);
  torch::serialize::OutputArchive archive;
  torch::serialize::OutputArchive modelArchive, optimizerArchive;
  model.save(modelArchive);
  optimizer.save(optimizerArchive);
  archive.write("model", modelArchive);
  archive.write("optimizer", optimizerArchive);
  archive.write("epoch", at::tensor(epoch, at::kLong));
  archive.write("steps", at::tensor(steps, at::kLong));
  archive.write("rng", at::detail::getDefaultCPUGenerator().get_state());
  const std::string finalPath = dir + "/" + checkpointName(epoch);
  const std::string tmpPath = finalPath + ".tmp";
  archive.save_to(tmpPath);
  // rename() is atomic: readers see the old checkpoint or the new one, whole.
  if (std::rename(tmpPath.c_str(), finalPath.c_str()) != 0) {
    throw std::runtime_error("checkpoint: cannot rename " + tmpPath + " to " + finalPath + ": " + strerror(errno));
  }
}

struct ResumeState {
  int64_t epoch = 0;
  int64_t steps = 0;
};

ResumeState loadCheckpoint(const std::string& path, torch::nn::Module& model, torch::optim::Optimizer& optimizer) {
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(path);
  } catch (const std::exception& e) {
    throw std::runtime_error("checkpoint " + path + " cannot be read: " + e.what());
  }
  torch::serialize::InputArchive modelArchive, optimizerArchive;
  archive.read("model", modelArchive);
  archive.read("optimizer", optimizerArchive);
  model.load(modelArchive);
  optimizer.load(optimizerArchive);
  at::Tensor epoch, steps, rng;
  archive.read("epoch", epoch);
  archive.read("steps", steps);
  archive.read("rng", rng);
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  generator.set_state(rng);
  return {epoch.item<int64_t>(), steps.item<int64_t>()};
}

std::string formatSeconds(double s) {
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof(buf), "%dh%02dm", int(s / 3600), int(std::fmod(s, 3600) / 60));
  else if (s >= 60) std::snprintf(buf, sizeof(buf), "%dm%02ds", int(s / 60), int(std::fmod(s, 60)));
  else std::snprintf(buf, sizeof(buf), "%.1fs", s);
  return buf;
}

std::string jsonNumberOrNull(const std::optional<double>& v) {
  if (!v || !std::isfinite(*v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.8g", *v);
  return buf;
}

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

// zeroGradients() without DDP: drops the gradients instead of zeroing them,
// so the next backward hands its fresh gradient tensors to the parameters
// (no zero pass, and no addition into zeros). To keep zeroing's semantics
// exactly (LibTorch 1.x's zero_grad(); 2.x's with set_to_none = false), a
// parameter that had a gradient and got none from the next backward (unused
// this step) is given zeros again before the optimizer sees it: the
// optimizer steps the same parameters with the same values.
class GradientReset {
 public:
  explicit GradientReset(std::vector<at::Tensor> params) : params_(std::move(params)), hadGrad_(params_.size(), 0) {}

  // Before optimizer->step(): zeros where zero_grad() would have left them.
  void fillUnused() {
    for (size_t i = 0; i < params_.size(); ++i) {
      if (hadGrad_[i] && !params_[i].grad().defined()) params_[i].mutable_grad() = at::zeros_like(params_[i]);
    }
  }
  // After optimizer->step(), instead of zero_grad().
  void reset() {
    for (size_t i = 0; i < params_.size(); ++i) {
      at::Tensor& grad = params_[i].mutable_grad();
      if (grad.defined()) {
        hadGrad_[i] = 1;
        grad.reset();
      }
    }
  }

 private:
  std::vector<at::Tensor> params_;
  std::vector<char> hadGrad_;
};

}  // namespace

void checkRunFolderIsFree(const std::string& runDir) {
  std::error_code ec;
  const bool hasMetrics = std::filesystem::exists(runDir + "/metrics.jsonl", ec);
  const bool hasCheckpoints = !std::filesystem::is_empty(runDir + "/checkpoints", ec) && !ec;
  if (hasMetrics || hasCheckpoints) {
    throw UsageError("run folder " + runDir + " already holds a run (" +
                     (hasCheckpoints ? "checkpoints/" : "metrics.jsonl") +
                     "). HINT: --resume to continue it, or another --out");
  }
}

namespace {

const char* const kMetricsCsvHeader = "epoch,train_loss,test_loss,test_accuracy,seconds\n";

void makeRunFolder(const std::string& runDir) {
  std::error_code ec;
  std::filesystem::create_directories(runDir, ec);
  if (ec) throw UsageError("cannot create run folder " + runDir + ": " + ec.message());
}

// The epoch of one metrics record, or -1 for a line that is not a whole
// record (the header, or the torn last line of a crashed run).
int64_t recordEpoch(const std::string& line, bool csv) {
  if (csv) {
    if (std::count(line.begin(), line.end(), ',') != 4) return -1;
    char* end = nullptr;
    const long long epoch = std::strtoll(line.c_str(), &end, 10);
    return end != line.c_str() && *end == ',' ? epoch : -1;
  }
  const Json record = Json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!record.is_object() || !record.contains("epoch") || !record["epoch"].is_number_integer()) return -1;
  return record["epoch"].get<int64_t>();
}

// After a resume from the checkpoint of `epoch`, keeps the whole records of
// epochs up to it: a crash may have left records of later epochs, which run
// again, and a torn line. Rewritten (or, when missing, created) through a
// temporary file and a rename, so a kill meanwhile leaves the old file.
void dropMetricsAfter(const std::string& runDir, int64_t epoch) {
  for (const bool csv : {false, true}) {
    const std::string path = runDir + (csv ? "/metrics.csv" : "/metrics.jsonl");
    std::ifstream in(path);
    std::string kept = csv ? kMetricsCsvHeader : "";
    std::string line;
    while (std::getline(in, line)) {
      const int64_t e = recordEpoch(line, csv);
      if (e >= 1 && e <= epoch) kept += line + "\n";
    }
    in.close();
    const std::string tmp = path + ".tmp";
    std::ofstream(tmp, std::ios::trunc) << kept;
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
      throw std::runtime_error("metrics: cannot rename " + tmp + " to " + path + ": " + strerror(errno));
    }
  }
}

}  // namespace

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

TrainResult runTraining(const ExperimentConfig& config, const DistributedContext& dist, const RunOptions& options,
                        PluginRegistry& registry) {
  ProcessGroup& group = *dist.group;
  const int rank = group.rank(), world = group.size();
  const bool writer = rank == 0;
  const auto& tc = config.training;
  if (tc.threads > 0) at::set_num_threads(static_cast<int>(tc.threads));

  // rank -> cuda:LOCAL_RANK when the experiment asks for GPUs.
  torch::Device device(torch::kCPU);
  if (config.distributed.device == "cuda") {
    if (!torch::cuda::is_available()) {
      throw UsageError("distributed.device: \"cuda\" needs a CUDA build of LibTorch and a GPU; found " +
                       std::to_string(torch::cuda::device_count()) + " device(s). HINT: --set distributed.device=cpu");
    }
    device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(dist.env.localRank %
                                                                       torch::cuda::device_count()));
  }

  // Same seed on every rank: the same split and the same initial weights
  // (DDP broadcasts rank 0's anyway).
  torch::manual_seed(tc.seed);
  DatasetContext dctx{tc.seed, config.configDir};
  DatasetSplits data = registry.get(PluginKind::Dataset, config.dataset.name).dataset(config.dataset.params, dctx);
  ModelPtr model = registry.get(PluginKind::Model, config.model.name)
                       .model(config.model.params, modelContextFor(data));
  if (device.is_cuda()) {
    model->to(device);
    data.trainFeatures = data.trainFeatures.to(device);
    data.trainTargets = data.trainTargets.to(device);
    data.testFeatures = data.testFeatures.to(device);
    data.testTargets = data.testTargets.to(device);
  }
  auto optimizer = registry.get(PluginKind::Optimizer, config.optimizer.name)
                       .optimizer(model->parameters(), config.optimizer.params);
  std::unique_ptr<LrScheduler> scheduler;
  if (config.scheduler) {
    scheduler = registry.get(PluginKind::Scheduler, config.scheduler->name).scheduler(config.scheduler->params);
  }
  LossFn lossFn = registry.get(PluginKind::Loss, config.loss.name).loss(config.loss.params);
  std::vector<double> baseLrs;
  for (auto& g : optimizer->param_groups()) baseLrs.push_back(g.options().get_lr());

  if (writer) {
    makeRunFolder(options.runDir);
    if (!config.resolved.is_null()) std::ofstream(options.runDir + "/config.json") << config.resolved.dump(2) << "\n";
  }
  RunLog log(writer, options.runDir, options.quiet);

  ResumeState resumed;
  if (options.resume) {
    const std::string path = newestCheckpoint(options.runDir);
    if (!path.empty()) {
      resumed = loadCheckpoint(path, *model, *optimizer);
      log.line("resumed from " + path + " after epoch " + std::to_string(resumed.epoch));
    } else {
      log.line("resume: no checkpoint in " + options.runDir + "/checkpoints; starting from scratch");
    }
  }

  std::unique_ptr<DistributedDataParallel> ddpModel;
  if (world > 1) {
    DdpOptions o;
    o.bucketCapBytes = static_cast<size_t>(config.distributed.bucketCapMb * 1024 * 1024);
    o.firstBucketCapBytes = static_cast<size_t>(config.distributed.firstBucketCapMb * 1024 * 1024);
    o.findUnusedParameters = config.distributed.findUnusedParameters;
    ddpModel = std::make_unique<DistributedDataParallel>(model, dist.group, o);
  }

  // DDP keeps gradients as views into its buckets: those must be zeroed in place.
  std::optional<GradientReset> gradientReset;
  if (!ddpModel) gradientReset.emplace(model->parameters());

  const int64_t trainN = data.trainFeatures.size(0);
  DistributedSampler sampler(trainN, rank, world, tc.seed, /*shuffle=*/true, tc.dropLast);
  sampler.setEpoch(resumed.epoch);

  // The test split, sharded: rank r evaluates rows r, r+w, ...; sums are reduced.
  const int64_t testN = data.testFeatures.size(0);
  at::Tensor testRows = at::arange(rank, std::max<int64_t>(testN, rank), world, at::kLong).to(device);
  at::Tensor testX = data.testFeatures.index_select(0, testRows);
  at::Tensor testY = data.testTargets.index_select(0, testRows);

  // Opened once, appended to and flushed every epoch (opening and closing
  // two files per epoch cost more than a small epoch's training).
  std::ofstream metricsJsonl, metricsCsv;
  if (writer) {
    if (options.resume) {
      dropMetricsAfter(options.runDir, resumed.epoch);
    } else {
      std::ofstream(options.runDir + "/metrics.jsonl", std::ios::trunc);
      std::ofstream(options.runDir + "/metrics.csv") << kMetricsCsvHeader;
    }
    metricsJsonl.open(options.runDir + "/metrics.jsonl", std::ios::app);
    metricsCsv.open(options.runDir + "/metrics.csv", std::ios::app);
  }
  log.line("experiment " + (config.name.empty() ? std::string("(unnamed)") : config.name) + ": " +
           std::to_string(trainN) + " train / " + std::to_string(testN) + " test samples, " + std::to_string(world) +
           " rank(s) x batch " + std::to_string(tc.batchSize) + ", " + std::to_string(tc.epochs) + " epochs");

  TrainResult result;
  result.steps = resumed.steps;
  const bool showProgress = writer && options.progress && !options.quiet && ::isatty(STDERR_FILENO);
  const auto trainStart = Clock::now();
  bool stop = tc.maxSteps > 0 && result.steps >= tc.maxSteps;
  // Fault injection for the launcher's tests: DDP_FAULT_INJECT="RANK:EPOCH"
  // makes that rank kill itself (SIGKILL) when the epoch starts, on the
  // first attempt only (DDP_RESTART unset or 0).
  int faultRank = -1;
  int64_t faultEpoch = -1;
  if (const char* fault = std::getenv("DDP_FAULT_INJECT")) {
    const char* restart = std::getenv("DDP_RESTART");
    if (!restart || std::string(restart) == "0") std::sscanf(fault, "%d:%ld", &faultRank, &faultEpoch);
  }
  for (int64_t epoch = resumed.epoch; epoch < tc.epochs && !stop; ++epoch) {
    if (rank == faultRank && epoch == faultEpoch) ::raise(SIGKILL);
    const auto epochStart = Clock::now();
    model->train();
    if (scheduler) {
      for (size_t g = 0; g < optimizer->param_groups().size(); ++g) {
        optimizer->param_groups()[g].options().set_lr(scheduler->lrAt(epoch, baseLrs[g]));
      }
    }
    BatchGather batch(sampler.nextEpoch());
    const int64_t myN = batch.size();
    double lossSum = 0;
    int64_t seen = 0;
    const int64_t batches = (myN + tc.batchSize - 1) / tc.batchSize;
    const int64_t usable = tc.dropLast ? myN / tc.batchSize : batches;
    int64_t micro = 0;
    for (int64_t b = 0; b < usable && !stop; ++b) {
      const int64_t begin = b * tc.batchSize, len = std::min(tc.batchSize, myN - begin);
      at::Tensor x = batch.rows(data.trainFeatures, begin, len);
      at::Tensor y = batch.rows(data.trainTargets, begin, len);
      const bool stepNow = (++micro % tc.accumulateGradBatches == 0) || b == usable - 1;
      at::Tensor loss = lossFn(model->forward(x), y);
      at::Tensor scaled = tc.accumulateGradBatches > 1 ? loss / double(tc.accumulateGradBatches) : loss;
      if (ddpModel && !stepNow) {
        auto guard = ddpModel->noSync();
        scaled.backward();
      } else {
        scaled.backward();
      }
      lossSum += loss.item<double>() * len;
      seen += len;
      if (stepNow) {
        if (ddpModel) ddpModel->finishGradientSync();
        if (gradientReset) gradientReset->fillUnused();
        optimizer->step();
        if (gradientReset) {
          gradientReset->reset();
        } else {
          zeroGradients(*optimizer);  // in place, keeping DDP's bucket views
        }
        micro = 0;
        ++result.steps;
        if (tc.maxSteps > 0 && result.steps >= tc.maxSteps) stop = true;
      }
      if (showProgress) {
        const double elapsed = std::chrono::duration<double>(Clock::now() - trainStart).count();
        const double done = (epoch - resumed.epoch) + double(b + 1) / usable;
        const double eta = elapsed / done * (tc.epochs - resumed.epoch - done);
        std::fprintf(stderr, "\r  epoch %lld/%lld  batch %lld/%lld  loss %.4f  ETA %s   ",
                     static_cast<long long>(epoch + 1), static_cast<long long>(tc.epochs),
                     static_cast<long long>(b + 1), static_cast<long long>(usable), loss.item<double>(),
                     formatSeconds(eta).c_str());
      }
    }

    EpochMetrics m;
    m.epoch = epoch + 1;
    std::vector<double> sums = {lossSum, double(seen)};
    const bool lastEpoch = epoch + 1 == tc.epochs || stop;
    const bool evaluate = lastEpoch || (tc.evalEvery > 0 && (epoch + 1) % tc.evalEvery == 0);
    if (evaluate) {
      torch::NoGradGuard noGrad;
      model->eval();
      double testLoss = 0, correct = 0;
      if (testX.size(0) > 0) {
        at::Tensor out = model->forward(testX);
        testLoss = lossFn(out, testY).item<double>() * testX.size(0);
        if (data.numClasses > 0) correct = out.argmax(1).eq(testY).sum().item<double>();
      }
      sums.insert(sums.end(), {testLoss, correct, double(testX.size(0))});
    }
    if (world > 1) {
      at::Tensor t = at::tensor(sums, at::kDouble);
      group.allreduce(t)->wait();
      sums.assign(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
    }
    m.trainLoss = sums[0] / std::max(1.0, sums[1]);
    if (evaluate && sums[4] > 0) {
      m.testLoss = sums[2] / sums[4];
      if (data.numClasses > 0) m.testAccuracy = sums[3] / sums[4];
    }
    m.seconds = std::chrono::duration<double>(Clock::now() - epochStart).count();
    result.history.push_back(m);

    if (writer) {
      if (showProgress) std::fprintf(stderr, "\r%*s\r", 80, "");
      char line[256];
      std::snprintf(line, sizeof(line),
                    "{\"epoch\": %lld, \"train_loss\": %.8g, \"test_loss\": %s, \"test_accuracy\": %s, "
                    "\"seconds\": %.6f}",
                    static_cast<long long>(m.epoch), m.trainLoss, jsonNumberOrNull(m.testLoss).c_str(),
                    jsonNumberOrNull(m.testAccuracy).c_str(), m.seconds);
      metricsJsonl << line << "\n";
      metricsJsonl.flush();
      metricsCsv << m.epoch << "," << m.trainLoss << "," << (m.testLoss ? std::to_string(*m.testLoss) : "") << ","
                 << (m.testAccuracy ? std::to_string(*m.testAccuracy) : "") << "," << m.seconds << "\n";
      metricsCsv.flush();
      std::snprintf(line, sizeof(line), "epoch %lld/%lld  train_loss %.4f%s%s  %.3fs",
                    static_cast<long long>(m.epoch), static_cast<long long>(tc.epochs), m.trainLoss,
                    m.testLoss ? ("  test_loss " + jsonNumberOrNull(m.testLoss)).c_str() : "",
                    m.testAccuracy ? ("  test_accuracy " + jsonNumberOrNull(m.testAccuracy)).c_str() : "",
                    m.seconds);
      const bool everyLine = tc.epochs <= 20 || evaluate || lastEpoch;
      if (everyLine) log.line(line);
    }
    if (tc.saveEvery > 0 && ((epoch + 1) % tc.saveEvery == 0 || lastEpoch)) {
      if (writer) saveCheckpoint(options.runDir, epoch + 1, result.steps, *model, *optimizer);
      // The others wait while rank 0 writes; a slow disk gets ten minutes.
      if (world > 1) group.barrier({std::chrono::milliseconds(600000)})->wait();
    }
  }
  result.loopSeconds = std::chrono::duration<double>(Clock::now() - trainStart).count();
  for (const auto& p : model->parameters()) result.finalParameters.push_back(p.detach().clone());
  return result;
}

}  // namespace ddp
