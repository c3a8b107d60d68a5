#include "framework/parallel/ddp.hpp"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <sstream>
#include <unordered_set>

#include "framework/core/errors.hpp"
#include "framework/core/log.hpp"
#include "framework/core/strings.hpp"
#include "framework/core/trace.hpp"
#include "framework/parallel/model_sync.hpp"

namespace ddp {

namespace {

constexpr size_t kMaxNamesInError = 10;

// At most kMaxNamesInError names, then how many more.
std::string someNames(const std::vector<std::string>& names) {
  if (names.size() <= kMaxNamesInError) return joinNames(names);
  const std::vector<std::string> first(names.begin(), names.begin() + kMaxNamesInError);
  return fmt::format("{}, ... ({} more)", joinNames(first), names.size() - kMaxNamesInError);
}

}  // namespace

// Autograd calls this after the parameter's AccumulateGrad node has run, so
// param.grad() already holds this pass's gradient.
class DistributedDataParallel::GradHook : public torch::autograd::FunctionPostHook {
 public:
  GradHook(DistributedDataParallel* owner, size_t index) : owner_(owner), index_(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    owner_->onGradientReady(index_);
    return outputs;
  }

 private:
  DistributedDataParallel* owner_;
  size_t index_;
};

DistributedDataParallel::NoSyncGuard::NoSyncGuard(DistributedDataParallel* owner) : owner_(owner) {
  std::lock_guard<std::mutex> lock(owner_->mutex_);
  ++owner_->noSyncDepth_;
}

DistributedDataParallel::NoSyncGuard::NoSyncGuard(NoSyncGuard&& other) noexcept : owner_(other.owner_) {
  other.owner_ = nullptr;
}

DistributedDataParallel::NoSyncGuard::~NoSyncGuard() {
  if (!owner_) return;
  std::lock_guard<std::mutex> lock(owner_->mutex_);
  --owner_->noSyncDepth_;
}

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<torch::nn::Module> module, ProcessGroupPtr group,
                                                 DdpOptions options)
    : module_(std::move(module)), group_(std::move(group)), options_(options) {
  if (!module_) fail<UsageError>("DDP: the module is null");
  if (!group_) fail<UsageError>("DDP: the process group is null");
  if (options_.bucketCapBytes == 0 || options_.firstBucketCapBytes == 0) {
    fail<UsageError>("DDP: bucket caps must be positive, got {} and {} bytes (first). HINT: use e.g. 25 MiB and 1 MiB",
                     options_.bucketCapBytes, options_.firstBucketCapBytes);
  }
  commHook_ = options_.commHook ? options_.commHook : std::make_shared<AllreduceAvgHook>(options_.timeout);

  if (!options_.statesEqual) verifyModelsMatch();

  std::vector<at::Tensor> everything, buffers;
  for (auto& [name, p] : uniqueParameters(*module_)) everything.push_back(p);
  for (auto& [name, b] : uniqueBuffers(*module_)) {
    everything.push_back(b);
    buffers.push_back(b);
  }
  if (!options_.statesEqual) broadcastFromRankZero(everything);
  buffers_ = std::make_unique<PackedBroadcast>(buffers);

  for (auto& [name, p] : uniqueParameters(*module_)) {
    if (!p.requires_grad()) continue;
    Param param;
    param.name = name;
    param.tensor = p;
    params_.push_back(std::move(param));
  }
  buildBuckets();
  logBucketLayout();
  readyThisStep_.assign(params_.size(), false);
  usedSinceSync_.assign(params_.size(), false);
  resetStepLocked();
  installHooks();
}

DistributedDataParallel::~DistributedDataParallel() {
  // Collectives in flight hold their own reference to the bucket buffers,
  // so only the hooks (which point at this object) must go.
  for (auto& p : params_) {
    if (p.accumulator) p.accumulator->del_post_hook(p.hookKey);
  }
}

void DistributedDataParallel::logBucketLayout() const {
  if (logLevel() < LogLevel::Info) return;
  size_t total = 0;
  for (const auto& bucket : buckets_) total += bucket.buffer.numel() * bucket.buffer.element_size();
  logInfo("DDP: {} bucket(s), {} parameter(s), {} bytes of gradients (caps {} bytes, first {})", buckets_.size(),
          params_.size(), total, options_.bucketCapBytes, options_.firstBucketCapBytes);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const Bucket& bucket = buckets_[b];
    const std::string& first = params_[bucket.params.front()].name;
    const std::string& last = params_[bucket.params.back()].name;
    logInfo("DDP: bucket {}: {} parameter(s) ({}{}{}), {} elements of {}, {} bytes", b, bucket.params.size(), first,
            bucket.params.size() > 1 ? " .. " : "", bucket.params.size() > 1 ? last : "", bucket.buffer.numel(),
            dtypeName(bucket.buffer), bucket.buffer.numel() * bucket.buffer.element_size());
  }
}

void DistributedDataParallel::registerCommHook(CommHookPtr hook) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!hook) fail<UsageError>("DDP: registerCommHook() got a null hook");
  if (anyBackward_) {
    fail<UsageError>(
        "DDP: registerCommHook() called after a backward pass. HINT: register the hook (or set "
        "DdpOptions::commHook) right after constructing DistributedDataParallel, before the first backward");
  }
  commHook_ = std::move(hook);
}

void DistributedDataParallel::verifyModelsMatch() { verifySameModel(*group_, *module_, "DDP", options_.timeout); }

void DistributedDataParallel::broadcastFromRankZero(const std::vector<at::Tensor>& tensors) {
  ddp::broadcastFromRankZero(*group_, tensors, options_.timeout);
}

void DistributedDataParallel::buildBuckets() {
  // Walk parameters in reverse registration order; each (dtype, device) has
  // one open bucket, closed when the next parameter would overflow its cap.
  // A parameter larger than the cap gets a bucket of its own.
  struct Open {
    std::vector<size_t> params;
    size_t bytes = 0;
    size_t firstPosition = 0;
    bool isFirstOfKey = true;
  };
  std::vector<std::pair<size_t, std::vector<size_t>>> closed;  // (first position, params)
  std::map<std::pair<int, std::string>, Open> open;
  for (size_t pos = 0; pos < params_.size(); ++pos) {
    const size_t i = params_.size() - 1 - pos;
    const at::Tensor& t = params_[i].tensor;
    const auto key = std::make_pair(static_cast<int>(t.scalar_type()), t.device().str());
    const size_t bytes = t.numel() * t.element_size();
    Open& o = open[key];
    const size_t cap = o.isFirstOfKey ? options_.firstBucketCapBytes : options_.bucketCapBytes;
    if (!o.params.empty() && o.bytes + bytes > cap) {
      closed.emplace_back(o.firstPosition, std::move(o.params));
      o = Open{};
      o.isFirstOfKey = false;
    }
    if (o.params.empty()) o.firstPosition = pos;
    o.params.push_back(i);
    o.bytes += bytes;
  }
  for (auto& [key, o] : open)
    if (!o.params.empty()) closed.emplace_back(o.firstPosition, std::move(o.params));
  std::sort(closed.begin(), closed.end(), [](const auto& a, const auto& b) { return a.first < b.first; });

  for (auto& [position, members] : closed) {
    Bucket bucket;
    int64_t numel = 0;
    for (size_t slot = 0; slot < members.size(); ++slot) {
      Param& p = params_[members[slot]];
      p.bucket = buckets_.size();
      p.slot = slot;
      bucket.params.push_back(members[slot]);
      bucket.tensors.push_back(p.tensor);
      bucket.offsets.push_back(numel);
      numel += p.tensor.numel();
    }
    const at::Tensor& first = params_[members.front()].tensor;
    bucket.buffer = group_->allocateCommunicationBuffer(numel, first.options().requires_grad(false));
    buckets_.push_back(std::move(bucket));
  }
}

void DistributedDataParallel::installHooks() {
  for (size_t i = 0; i < params_.size(); ++i) {
    Param& p = params_[i];
    // The variable holds its accumulator weakly; holding it here keeps the
    // same node (and our hook) alive across iterations.
    p.accumulator = torch::autograd::impl::grad_accumulator(p.tensor);
    DDP_CHECK(p.accumulator != nullptr, fmt::format("no gradient accumulator for parameter {}", p.name));
    p.hookKey = p.accumulator->add_post_hook(std::make_unique<GradHook>(this, i));
  }
}

void DistributedDataParallel::onGradientReady(size_t index) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto now = Clock::now();
  if (!inBackward_) {
    // The first hook of a backward pass.
    anyBackward_ = true;
    if (syncedPasses_ > 0) {
      fail<UsageError>(
          "DDP: a backward pass started before finishGradientSync() for the previous synced backward. HINT: call "
          "finishGradientSync() after every backward outside noSync(), before the next backward");
    }
    inBackward_ = true;
    currentPassSynced_ = noSyncDepth_ == 0;
    if (currentPassSynced_) timeline_.backwardStart = now;
    // Runs once autograd has finished this whole pass.
    torch::autograd::Engine::get_default_engine().queue_callback([this] { onBackwardEnd(); });
  }
  usedSinceSync_[index] = true;
  if (!currentPassSynced_) return;
  timeline_.backwardEnd = now;
  copyGradIntoBucket(index);
  markReadyLocked(index);
  if (options_.overlap) launchReadyBucketsLocked(/*inBackward=*/true);
}

void DistributedDataParallel::shadowBackward() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (inBackward_ || noSyncDepth_ > 0 || syncedPasses_ > 0 || localPasses_ > 0) {
    fail<UsageError>(
        "DDP: shadowBackward() is for a rank with no batch in this step; it must replace the step's backward passes, "
        "outside noSync(). HINT: call it instead of loss.backward(), then finishGradientSync()");
  }
  anyBackward_ = true;
  at::NoGradGuard noGrad;
  for (Bucket& bucket : buckets_) bucket.buffer.zero_();
  for (size_t i = 0; i < params_.size(); ++i) {
    usedSinceSync_[i] = true;
    markReadyLocked(i);
  }
  ++syncedPasses_;
  launchReadyBucketsLocked(/*inBackward=*/false);
}

void DistributedDataParallel::setContributors(int contributors) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (contributors < 1 || contributors > group_->size()) {
    fail<UsageError>("DDP: setContributors({}) outside 1..{} (the world size)", contributors, group_->size());
  }
  contributors_ = contributors;
}

void DistributedDataParallel::onBackwardEnd() {
  std::lock_guard<std::mutex> lock(mutex_);
  inBackward_ = false;
  if (currentPassSynced_)
    ++syncedPasses_;
  else
    ++localPasses_;
}

bool DistributedDataParallel::isBucketSlice(const at::Tensor& grad, const Bucket& bucket, size_t slot) {
  if (!grad.is_contiguous() || grad.scalar_type() != bucket.buffer.scalar_type()) return false;
  const auto* start = static_cast<const char*>(bucket.buffer.data_ptr()) +
                      bucket.offsets[slot] * static_cast<int64_t>(bucket.buffer.element_size());
  return grad.data_ptr() == start;
}

void DistributedDataParallel::copyGradIntoBucket(size_t index) {
  at::NoGradGuard noGrad;
  const Param& p = params_[index];
  Bucket& bucket = buckets_[p.bucket];
  const at::Tensor& grad = p.tensor.grad();
  if (grad.defined() && grad.is_sparse()) {
    fail<UsageError>(
        "DDP: parameter '{}' has a sparse gradient, which DDP does not support. HINT: use a dense embedding "
        "(sparse=false)",
        p.name);
  }
  // Accumulated in place (the usual case with gradientAsBucketView): no
  // tensor op at all, since each costs microseconds on a small model.
  if (grad.defined() && isBucketSlice(grad, bucket, p.slot)) return;
  at::Tensor slice = bucket.buffer.narrow(0, bucket.offsets[p.slot], p.tensor.numel());
  if (!grad.defined()) {
    slice.zero_();
    return;
  }
  slice.view(grad.sizes()).copy_(grad);
}

void DistributedDataParallel::markReadyLocked(size_t index) {
  DDP_CHECK(!readyThisStep_[index], fmt::format("gradient of {} marked ready twice in one step", params_[index].name));
  readyThisStep_[index] = true;
  --buckets_[params_[index].bucket].pending;
}

void DistributedDataParallel::launchReadyBucketsLocked(bool inBackward) {
  // Strictly in index order, so every rank issues the same collectives.
  while (nextToLaunch_ < buckets_.size() && buckets_[nextToLaunch_].pending == 0) {
    launchBucketLocked(nextToLaunch_, inBackward);
    ++nextToLaunch_;
  }
}

void DistributedDataParallel::launchBucketLocked(size_t b, bool inBackward) {
  Bucket& bucket = buckets_[b];
  timeline_.bucketLaunch[b] = Clock::now();
  timeline_.launchedDuringBackward[b] = inBackward;
  // The average over one rank is the gradient itself: no collective, no
  // hand-off to the backend's thread.
  if (group_->size() > 1) {
    GradBucket view{b, bucket.buffer, bucket.tensors};
    const auto hookStart = Clock::now();
    bucket.work = commHook_->run(*group_, view);
    timeline_.hookSeconds += std::chrono::duration<double>(Clock::now() - hookStart).count();
    DDP_CHECK(bucket.work != nullptr, fmt::format("the comm hook returned no Work for bucket {}", b));
    if (trace::enabled()) {
      // Ends on the thread that finishes the collective (or here, when the
      // hook ran it inline).
      const int64_t step = trace::currentStep();
      const auto launched = timeline_.bucketLaunch[b];
      std::string args = fmt::format(R"({{"bucket":{},"bytes":{},"during_backward":{}}})", b,
                                     bucket.buffer.numel() * bucket.buffer.element_size(), inBackward);
      bucket.work->onFinish([launched, step, args = std::move(args)]() mutable {
        trace::record("bucket allreduce", trace::Track::Comm, launched, trace::Clock::now(), step, std::move(args));
      });
    }
  }
  bucket.launched = true;
}

void DistributedDataParallel::resetStepLocked() {
  syncedPasses_ = 0;
  localPasses_ = 0;
  contributors_ = group_->size();
  std::fill(readyThisStep_.begin(), readyThisStep_.end(), false);
  std::fill(usedSinceSync_.begin(), usedSinceSync_.end(), false);
  nextToLaunch_ = 0;
  for (auto& bucket : buckets_) {
    bucket.pending = bucket.params.size();
    bucket.launched = false;
    bucket.work.reset();
  }
  timeline_ = SyncTimeline{};
  timeline_.bucketLaunch.assign(buckets_.size(), Clock::time_point{});
  timeline_.launchedDuringBackward.assign(buckets_.size(), false);
}

void DistributedDataParallel::finishGradientSync() {
  std::vector<std::string> unused;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto start = Clock::now();
    if (noSyncDepth_ > 0) {
      fail<UsageError>(
          "DDP: finishGradientSync() called inside noSync(). HINT: end the noSync() guard first; the backward pass "
          "after it averages the accumulated gradients");
    }
    if (inBackward_) {
      fail<UsageError>(
          "DDP: finishGradientSync() called while a backward pass is unfinished or after one failed. HINT: call it "
          "after loss.backward() has returned");
    }
    if (syncedPasses_ == 0 && localPasses_ == 0) {
      fail<UsageError>(
          "DDP: finishGradientSync() called with no backward pass since the last one. HINT: call it once after each "
          "loss.backward(), before optimizer.step()");
    }
    timeline_.finishStart = start;

    // Gradients that did not arrive in the synced pass: accumulated in
    // noSync passes only (use them), or none at all (zeros).
    for (size_t i = 0; i < params_.size(); ++i) {
      if (readyThisStep_[i]) continue;
      if (!usedSinceSync_[i]) {
        unused.push_back(params_[i].name);
        at::NoGradGuard noGrad;
        const Param& p = params_[i];
        buckets_[p.bucket].buffer.narrow(0, buckets_[p.bucket].offsets[p.slot], p.tensor.numel()).zero_();
      } else {
        copyGradIntoBucket(i);
      }
      markReadyLocked(i);
    }
    // Unused parameters are a rank's error, but its peers have launched
    // their collectives: complete them here so nobody is left waiting.
    launchReadyBucketsLocked(/*inBackward=*/false);
    DDP_CHECK(nextToLaunch_ == buckets_.size(), "not every bucket launched at finishGradientSync");

    // Every bucket's Work is waited for, even after one failed, so that
    // nothing of this step (a hook's later stages) still writes into the
    // buckets when the error reaches the caller.
    std::exception_ptr failed;
    trace::Scope waitSpan("gradient wait");
    for (auto& bucket : buckets_) {
      if (!bucket.work) continue;
      try {
        bucket.work->wait();
      } catch (...) {
        if (!failed) failed = std::current_exception();
      }
    }
    if (failed) {
      resetStepLocked();
      std::rethrow_exception(failed);
    }
    // The buckets hold the mean over every rank; with ranks that shadowed
    // this step (zeros), the mean over those that contributed.
    if (contributors_ < group_->size()) {
      at::NoGradGuard noGrad;
      const double scale = double(group_->size()) / double(contributors_);
      for (auto& bucket : buckets_) bucket.buffer.mul_(scale);
    }

    const bool failing = !unused.empty() && !options_.findUnusedParameters;
    if (!failing) {
      at::NoGradGuard noGrad;
      for (Param& p : params_) {
        const Bucket& bucket = buckets_[p.bucket];
        at::Tensor& grad = p.tensor.mutable_grad();
        if (grad.defined() && isBucketSlice(grad, bucket, p.slot)) continue;
        at::Tensor averaged = bucket.buffer.narrow(0, bucket.offsets[p.slot], p.tensor.numel()).view(p.tensor.sizes());
        if (options_.gradientAsBucketView && p.tensor.is_contiguous()) {
          // A plain tensor on the bucket's storage, not an autograd view:
          // optimizers detach_() and zero_() gradients in place, which
          // autograd refuses on views.
          grad = at::empty({0}, averaged.options()).set_(averaged.storage(), averaged.storage_offset(),
                                                         averaged.sizes(), averaged.strides());
        } else if (grad.defined()) {
          grad.copy_(averaged);
        } else {
          grad = averaged.clone();
        }
      }
    } else {
      std::sort(unused.begin(), unused.end());
    }
    timeline_.finishEnd = Clock::now();
    lastTimeline_ = timeline_;
    lastWaitSeconds_ =
        std::chrono::duration<double>(timeline_.finishEnd - timeline_.finishStart).count() + timeline_.hookSeconds;
    resetStepLocked();
    if (options_.findUnusedParameters) unused.clear();
  }
  // Also when about to throw, so every rank runs the same collectives.
  if (options_.broadcastBuffers) {
    const auto buffersStart = Clock::now();
    syncBuffers();
    const double seconds = std::chrono::duration<double>(Clock::now() - buffersStart).count();
    std::lock_guard<std::mutex> lock(mutex_);
    lastTimeline_.buffersSeconds = seconds;
  }
  if (!unused.empty()) {
    fail<UsageError>(
        "DDP: parameters received no gradient in this iteration: {}. HINT: set distributed.find_unused_parameters = "
        "true, or make every parameter take part in the loss",
        someNames(unused));
  }
}

void DistributedDataParallel::syncBuffers() {
  buffers_->run(*group_, options_.timeout);
}

std::vector<DistributedDataParallel::BucketInfo> DistributedDataParallel::bucketInfo() const {
  std::vector<BucketInfo> infos;
  for (const auto& bucket : buckets_) {
    BucketInfo info;
    for (size_t i : bucket.params) info.parameterNames.push_back(params_[i].name);
    info.numel = static_cast<size_t>(bucket.buffer.numel());
    info.bytes = info.numel * bucket.buffer.element_size();
    info.dtype = dtypeName(bucket.buffer);
    infos.push_back(std::move(info));
  }
  return infos;
}

double DistributedDataParallel::lastSyncWaitSeconds() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return lastWaitSeconds_;
}

DistributedDataParallel::SyncTimeline DistributedDataParallel::lastSyncTimeline() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return lastTimeline_;
}

std::vector<double> averageAcrossRanks(ProcessGroup& group, const std::vector<double>& values) {
  if (values.empty() || group.size() == 1) return values;
  at::Tensor t = at::empty({static_cast<int64_t>(values.size())}, at::kDouble);
  std::memcpy(t.data_ptr<double>(), values.data(), values.size() * sizeof(double));
  AllreduceOptions opts;
  opts.op = ReduceOp::Avg;
  group.allreduce(t, opts)->wait();
  return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + values.size());
}

double averageAcrossRanks(ProcessGroup& group, double value) { return averageAcrossRanks(group, std::vector<double>{value})[0]; }

}  // namespace ddp
