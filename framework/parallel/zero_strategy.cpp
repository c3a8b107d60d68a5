#include "framework/parallel/zero_strategy.hpp"

#include <torch/torch.h>

#include <cstring>
#include <deque>
#include <mutex>
#include <map>
#include <optional>
#include <set>
#include <algorithm>
#include <unordered_map>

#include "framework/core/errors.hpp"
#include "framework/parallel/grad_ready_hooks.hpp"
#include "framework/parallel/model_sync.hpp"
#include "framework/parallel/optimizer_state.hpp"

namespace ddp {

namespace {

using torch::optim::OptimizerParamState;
using StateMap = std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>;

// Rank 0's string on every rank (two int64 broadcasts).
std::string broadcastString(ProcessGroup& group, const std::string& text, Milliseconds timeout) {
  at::Tensor length = at::full({1}, static_cast<int64_t>(text.size()), at::kLong);
  group.broadcast(length, {0, timeout})->wait();
  const int64_t n = length.item<int64_t>();
  at::Tensor packed = at::zeros({(n + 7) / 8}, at::kLong);
  if (group.rank() == 0) std::memcpy(packed.data_ptr(), text.data(), text.size());
  if (packed.numel() > 0) group.broadcast(packed, {0, timeout})->wait();
  return std::string(reinterpret_cast<const char*>(packed.data_ptr()), static_cast<size_t>(n));
}

}  // namespace

struct ZeroStrategy::Impl {
  int stage = 1;
  int64_t bucketCapBytes = 0;
  std::shared_ptr<torch::nn::Module> model;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  ProcessGroupPtr group;
  Milliseconds timeout;
  int rank = 0, world = 1;
  const char* who() const { return stage == 1 ? "zero1" : "zero2"; }

  std::vector<at::Tensor> params;     // require grad, unique, registration order
  std::vector<at::Tensor> gradViews;  // params[i]'s gradient: a view of flatGrad
  std::vector<std::optional<FlatShards::Piece>> pieceInfo;
  std::vector<at::Tensor> pieces;     // params[i]'s piece (undefined where none)
  std::vector<at::Tensor> buffers;
  std::unordered_map<const void*, size_t> indexOf;  // param TensorImpl -> i
  std::optional<FlatShards> shards;

  at::Tensor flatGrad, shardGrad, flatParam;  // flatGrad: stage 1 only

  // Stage 2: each bucket's gradients are staged as they arrive, then
  // reduce-scattered into `scratch` and added to this rank's shardGrad.
  std::mutex mutex;  // hooks may run on autograd's threads
  std::unique_ptr<GradReadyHooks> hooks;
  std::vector<at::Tensor> staging, scratch;
  std::vector<size_t> arrived;  // per bucket, this backward pass
  size_t nextLaunch = 0;
  std::deque<std::pair<size_t, WorkPtr>> inFlight;
  static constexpr size_t kMaxInFlight = 2;  // buckets whose staging is held at once
  // The optimizer's param groups as given (full parameters), and as this
  // strategy runs them (pieces).
  std::vector<std::vector<at::Tensor>> fullGroups, pieceGroups;

  void build();
  void onGradient(size_t i);
  void launchBucketLocked(size_t b);
  void finishOldestLocked();
  void flushBuckets();
  void slicePieceStates();
  void syncGradientViews();
  // Full states of the trainable parameters, on rank 0 (null elsewhere).
  std::unique_ptr<StateMap> gatherFullStates();
};

void ZeroStrategy::Impl::build() {
  rank = group->rank();
  world = group->size();
  at::NoGradGuard noGrad;
  verifySameModel(*group, *model, who(), timeout);
  // Sparse gradients would only show at the first step: refuse them now.
  for (const auto& item : model->named_modules("", /*include_self=*/true)) {
    const torch::nn::Module& m = *item.value();
    bool sparse = false;
    if (auto* e = dynamic_cast<const torch::nn::EmbeddingImpl*>(&m)) sparse = e->options.sparse();
    if (auto* e = dynamic_cast<const torch::nn::EmbeddingBagImpl*>(&m)) sparse = e->options.sparse();
    if (sparse) {
      fail<UsageError>("{}: module '{}' is an embedding with sparse gradients; {} reduces dense gradients. HINT: "
                       "build it with sparse(false), or use distributed.strategy=ddp",
                       who(), item.key(), who());
    }
  }

  std::vector<int64_t> numels;
  std::string firstName;
  auto named = uniqueParameters(*model);
  // zero2 reduces bucket by bucket while backward runs, which produces
  // gradients roughly from the last registered parameter to the first.
  if (stage == 2) std::reverse(named.begin(), named.end());
  for (auto& [name, p] : named) {
    if (!p.requires_grad()) continue;
    if (!params.empty() && p.scalar_type() != params.front().scalar_type()) {
      fail<UsageError>("{}: parameter '{}' is {} but '{}' is {}; it shards one flat buffer of one dtype. "
                       "HINT: cast the model to one dtype, or use distributed.strategy=ddp",
                       who(), name, dtypeName(p), firstName, dtypeName(params.front()));
    }
    if (!at::isFloatingType(p.scalar_type())) {
      fail<UsageError>("{}: parameter '{}' is {}; only floating-point parameters can be trained", who(), name,
                       dtypeName(p));
    }
    if (params.empty()) firstName = name;
    indexOf[p.unsafeGetTensorImpl()] = params.size();
    params.push_back(p);
    numels.push_back(p.numel());
  }
  for (auto& [name, b] : uniqueBuffers(*model)) buffers.push_back(b);
  const auto options = params.empty() ? at::TensorOptions(at::kFloat) : params.front().options().requires_grad(false);
  const int64_t elementSize = static_cast<int64_t>(c10::elementSize(options.dtype().toScalarType()));
  shards.emplace(numels, world, stage == 2 ? std::max<int64_t>(1, bucketCapBytes / elementSize) : 0);
  const int64_t S = shards->shardSize();
  if (stage == 1) flatGrad = at::zeros({shards->paddedTotal()}, options);
  flatParam = at::zeros({shards->paddedTotal()}, options);
  shardGrad = at::zeros({S}, options);

  // Rank 0's parameters and buffers everywhere, as DDP starts.
  std::vector<at::Tensor> everything(params.begin(), params.end());
  for (auto& [name, p] : uniqueParameters(*model))
    if (!p.requires_grad()) everything.push_back(p);
  everything.insert(everything.end(), buffers.begin(), buffers.end());
  broadcastFromRankZero(*group, everything, timeout);

  for (size_t i = 0; i < params.size(); ++i) {
    at::Tensor& p = params[i];
    // The parameter becomes a view of flatParam, so the allgather after
    // each step writes it in place (its autograd identity is kept).
    at::Tensor slot = flatParam.narrow(0, shards->offset(i), p.numel());
    slot.copy_(p.detach().reshape({-1}));
    p.set_data(slot.view(p.sizes()));
    if (stage == 1) {
      gradViews.push_back(flatGrad.narrow(0, shards->offset(i), p.numel()).view(p.sizes()));
      if (p.grad().defined()) gradViews.back().copy_(p.grad());
      p.mutable_grad() = gradViews.back();
    } else {
      p.mutable_grad().reset();  // zero2 keeps no full gradient between steps
    }
  }
  // This rank's pieces are its slices of flatParam: the optimizer updates
  // them in place, and the allgathers (in place) fill in the other ranks'.
  for (size_t i = 0; i < params.size(); ++i) {
    pieceInfo.push_back(shards->pieceOf(i, rank));
    if (!pieceInfo.back()) {
      pieces.emplace_back();
      continue;
    }
    const auto& piece = *pieceInfo.back();
    pieces.push_back(flatParam.narrow(0, shards->offset(i) + piece.paramOffset, piece.length));
    pieces.back().mutable_grad() = shardGrad.narrow(0, piece.shardOffset, piece.length);
  }
  if (stage == 2) {
    const size_t nb = shards->buckets().size();
    staging.resize(nb);
    scratch.resize(nb);
    arrived.assign(nb, 0);
    hooks = std::make_unique<GradReadyHooks>(params, [this](size_t i) { onGradient(i); });
  }

  // The optimizer steps pieces: trainable parameters are swapped for this
  // rank's pieces (or dropped where it owns none); others stay.
  for (auto& g : optimizer->param_groups()) {
    fullGroups.push_back(g.params());
    std::vector<at::Tensor> mine;
    for (const at::Tensor& p : g.params()) {
      auto it = indexOf.find(p.unsafeGetTensorImpl());
      if (it == indexOf.end()) {
        mine.push_back(p);
      } else if (pieces[it->second].defined()) {
        mine.push_back(pieces[it->second]);
      }
    }
    pieceGroups.push_back(mine);
  }
  slicePieceStates();
  for (size_t g = 0; g < pieceGroups.size(); ++g) optimizer->param_groups()[g].params() = pieceGroups[g];
}

void ZeroStrategy::Impl::onGradient(size_t i) {
  std::lock_guard<std::mutex> lock(mutex);
  at::Tensor& grad = params[i].mutable_grad();
  if (!grad.defined()) return;
  if (grad.is_sparse()) {
    fail<UsageError>("{}: parameter #{} got a sparse gradient; it reduces dense gradients. HINT: use dense "
                     "embeddings (sparse=false) or distributed.strategy=ddp",
                     who(), i);
  }
  const size_t b = shards->bucketOf(i);
  const FlatShards::Bucket& bucket = shards->buckets()[b];
  if (!staging[b].defined()) staging[b] = at::zeros({bucket.padded(world)}, flatParam.options());
  staging[b].narrow(0, shards->offset(i) - bucket.offset, params[i].numel()).copy_(grad.reshape({-1}));
  grad.reset();  // the bucket holds it now
  ++arrived[b];
  // Buckets start in index order on every rank, whatever order the hooks
  // fire in, so every rank issues the same collectives.
  while (nextLaunch < arrived.size() && arrived[nextLaunch] == shards->buckets()[nextLaunch].endParam -
                                                                   shards->buckets()[nextLaunch].firstParam) {
    launchBucketLocked(nextLaunch++);
  }
}

void ZeroStrategy::Impl::launchBucketLocked(size_t b) {
  const FlatShards::Bucket& bucket = shards->buckets()[b];
  if (!staging[b].defined()) staging[b] = at::zeros({bucket.padded(world)}, flatParam.options());
  scratch[b] = at::empty({bucket.slice}, flatParam.options());
  inFlight.emplace_back(b, group->reduceScatter(staging[b], scratch[b], {ReduceOp::Avg, timeout}));
  while (inFlight.size() > kMaxInFlight) finishOldestLocked();
}

void ZeroStrategy::Impl::finishOldestLocked() {
  auto [b, work] = std::move(inFlight.front());
  inFlight.pop_front();
  work->wait();
  const FlatShards::Bucket& bucket = shards->buckets()[b];
  shardGrad.narrow(0, bucket.shardOffset, bucket.slice).add_(scratch[b]);
  staging[b].reset();
  scratch[b].reset();
}

// After a backward pass: buckets whose parameters did not all get a
// gradient start now (the missing ones count as zeros), in order, and every
// bucket's average is added to this rank's shard of the gradient.
void ZeroStrategy::Impl::flushBuckets() {
  std::lock_guard<std::mutex> lock(mutex);
  while (nextLaunch < arrived.size()) launchBucketLocked(nextLaunch++);
  while (!inFlight.empty()) finishOldestLocked();
  std::fill(arrived.begin(), arrived.end(), 0);
  nextLaunch = 0;
}

// A resumed optimizer holds the full parameters' state: keep this rank's
// part of every tensor shaped like its parameter.
void ZeroStrategy::Impl::slicePieceStates() {
  StateMap& state = optimizer->state();
  for (size_t i = 0; i < params.size(); ++i) {
    auto it = state.find(stateKey(params[i]));
    if (it == state.end()) continue;
    if (pieces[i].defined()) {
      StateEntries entries = stateEntries(*it->second);
      for (auto& [key, value] : entries) {
        if (!value.isTensor()) continue;
        const at::Tensor t = value.toTensor();
        if (t.defined() && t.dim() > 0 && t.sizes() == params[i].sizes()) {
          value = t.reshape({-1}).narrow(0, pieceInfo[i]->paramOffset, pieceInfo[i]->length).clone();
        }
      }
      auto pieceState = stateFrom(*it->second, entries);
      state.erase(it);
      state[stateKey(pieces[i])] = std::move(pieceState);
    } else {
      state.erase(it);
    }
  }
}

void ZeroStrategy::Impl::syncGradientViews() {
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& g = params[i].grad();
    if (g.defined() && g.is_same(gradViews[i])) continue;
    if (g.defined()) {
      if (g.is_sparse()) {
        fail<UsageError>("{}: parameter #{} got a sparse gradient; it reduces dense gradients. HINT: use dense "
                         "embeddings (sparse=false) or distributed.strategy=ddp",
                         who(), i);
      }
      // Something replaced the gradient tensor (an optimizer's zero_grad
      // with set_to_none, or a hook): take its values back into the buffer.
      if (g.data_ptr() != gradViews[i].data_ptr()) gradViews[i].copy_(g);
    }
    params[i].mutable_grad() = gradViews[i];
  }
}

std::unique_ptr<StateMap> ZeroStrategy::Impl::gatherFullStates() {
  // Rank 0 decides which state values are per element (a tensor shaped
  // like its piece) and tells the others: every rank then runs the same
  // allgathers, including ranks that own no piece.
  const OptimizerParamState* templ = nullptr;
  size_t templPiece = 0;
  for (size_t i = 0; i < params.size() && !templ; ++i) {
    if (!pieces[i].defined()) continue;
    auto it = optimizer->state().find(stateKey(pieces[i]));
    if (it != optimizer->state().end()) {
      templ = it->second.get();
      templPiece = i;
    }
  }
  std::string keyList;
  StateEntries templEntries;
  if (rank == 0 && templ) {
    templEntries = stateEntries(*templ);
    keyList = "state\n";
    for (const auto& [key, value] : templEntries) {
      if (value.isTensor() && value.toTensor().dim() == 1 && value.toTensor().numel() == pieceInfo[templPiece]->length)
        keyList += key + "\n";
    }
  }
  keyList = broadcastString(*group, keyList, timeout);
  if (keyList.empty()) return rank == 0 ? std::make_unique<StateMap>() : nullptr;  // no step taken yet
  std::vector<std::string> keys;
  for (size_t at = keyList.find('\n') + 1, nl; (nl = keyList.find('\n', at)) != std::string::npos; at = nl + 1)
    keys.push_back(keyList.substr(at, nl - at));

  // Each rank's pieces' values of each key, one flat shard per key.
  std::vector<StateEntries> mine(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    if (!pieces[i].defined()) continue;
    auto it = optimizer->state().find(stateKey(pieces[i]));
    if (it != optimizer->state().end()) mine[i] = stateEntries(*it->second);
  }
  std::map<std::string, at::Tensor> full;
  for (const std::string& key : keys) {
    at::Tensor shard = at::zeros({shards->shardSize()}, flatParam.options());
    for (size_t i = 0; i < params.size(); ++i) {
      for (const auto& [k, value] : mine[i]) {
        if (k == key && value.isTensor())
          shard.narrow(0, pieceInfo[i]->shardOffset, pieceInfo[i]->length).copy_(value.toTensor());
      }
    }
    at::Tensor gathered = at::empty({shards->paddedTotal()}, flatParam.options());
    group->allgather(shard, gathered, {timeout})->wait();
    if (rank == 0) full[key] = gathered;
  }
  if (rank != 0) return nullptr;

  auto states = std::make_unique<StateMap>();
  const int64_t S = shards->shardSize();
  for (size_t i = 0; i < params.size(); ++i) {
    StateEntries entries = templEntries;
    for (auto& [key, value] : entries) {
      auto it = full.find(key);
      if (it == full.end()) continue;
      // Rank r's piece of parameter i sits in rank r's shard of the gathered tensor.
      std::vector<at::Tensor> parts;
      for (int r = 0; r < world; ++r) {
        if (auto piece = shards->pieceOf(i, r)) parts.push_back(it->second.narrow(0, r * S + piece->shardOffset, piece->length));
      }
      value = (parts.empty() ? at::zeros({0}, flatParam.options()) : at::cat(parts)).view(params[i].sizes()).clone();
    }
    (*states)[stateKey(params[i])] = stateFrom(*templ, entries);
  }
  return states;
}

ZeroStrategy::ZeroStrategy(StrategyContext context, int stage) : impl_(std::make_unique<Impl>()) {
  DDP_CHECK(stage == 1 || stage == 2, "ZeroStrategy: stage must be 1 or 2");
  impl_->stage = stage;
  impl_->bucketCapBytes = static_cast<int64_t>(context.ddp.bucketCapBytes);
  impl_->model = std::move(context.model);
  impl_->optimizer = std::move(context.optimizer);
  impl_->group = std::move(context.group);
  impl_->timeout = context.ddp.timeout;
  impl_->build();
}

ZeroStrategy::~ZeroStrategy() = default;

const char* ZeroStrategy::name() const { return impl_->who(); }
torch::nn::Module& ZeroStrategy::model() { return *impl_->model; }
torch::optim::Optimizer& ZeroStrategy::optimizer() { return *impl_->optimizer; }
const FlatShards& ZeroStrategy::shards() const { return *impl_->shards; }

void ZeroStrategy::backward(const at::Tensor& loss, bool /*lastMicroBatch*/) {
  loss.backward();
  // zero2 reduces every micro-batch (it keeps no full gradient to
  // accumulate into); its shard sums them.
  if (impl_->stage == 2) impl_->flushBuckets();
}

void ZeroStrategy::step() {
  Impl& s = *impl_;
  const auto& buckets = s.shards->buckets();
  if (s.stage == 1) {
    s.syncGradientViews();
    std::vector<WorkPtr> works;
    for (const auto& b : buckets) {
      at::Tensor out = s.shardGrad.narrow(0, b.shardOffset, b.slice);
      works.push_back(s.group->reduceScatter(s.flatGrad.narrow(0, b.offset, b.padded(s.world)), out,
                                             {ReduceOp::Avg, s.timeout}));
    }
    for (auto& w : works) w->wait();
  }
  s.optimizer->step();
  // The parameters are views of flatParam: the allgathers, in place,
  // update the model.
  std::vector<WorkPtr> works;
  for (const auto& b : buckets) {
    at::Tensor whole = s.flatParam.narrow(0, b.offset, b.padded(s.world));
    works.push_back(s.group->allgather(whole.narrow(0, s.rank * b.slice, b.slice), whole, {s.timeout}));
  }
  for (auto& w : works) w->wait();
  if (s.stage == 1) s.flatGrad.zero_();
  if (s.stage == 2) s.shardGrad.zero_();
  if (!s.buffers.empty() && s.world > 1) broadcastFromRankZero(*s.group, s.buffers, s.timeout);
}

ParallelStrategy::HeldBytes ZeroStrategy::heldBytes() {
  Impl& s = *impl_;
  HeldBytes held;
  std::vector<at::Tensor> params = s.model->parameters(), grads = {s.flatGrad, s.shardGrad};
  params.push_back(s.flatParam);
  for (const at::Tensor& p : s.model->parameters()) grads.push_back(p.grad());
  grads.insert(grads.end(), s.staging.begin(), s.staging.end());
  held.parameters = storageBytes(params);
  held.gradients = storageBytes(grads);
  held.optimizerState = optimizerStateBytes(*s.optimizer);
  return held;
}

void ZeroStrategy::saveState(torch::serialize::OutputArchive* archive) {
  Impl& s = *impl_;
  std::unique_ptr<StateMap> full = s.gatherFullStates();
  if (!archive) return;
  // Write as one process holding the full parameters would: swap the full
  // parameters and their state in, save, swap the pieces back.
  auto& groups = s.optimizer->param_groups();
  StateMap pieceStates = std::move(s.optimizer->state());
  s.optimizer->state() = std::move(*full);
  for (size_t g = 0; g < groups.size(); ++g) groups[g].params() = s.fullGroups[g];
  auto restore = [&] {
    for (size_t g = 0; g < groups.size(); ++g) groups[g].params() = s.pieceGroups[g];
    s.optimizer->state() = std::move(pieceStates);
  };
  try {
    saveModelAndOptimizer(*archive, *s.model, *s.optimizer);
  } catch (...) {
    restore();
    throw;
  }
  restore();
}

}  // namespace ddp
