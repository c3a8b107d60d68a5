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
  [[noreturn]] void failSparseGradient(size_t i) const {
    fail<UsageError>("{}: parameter #{} got a sparse gradient; it reduces dense gradients. HINT: use dense "
                     "embeddings (sparse=false) or distributed.strategy=ddp",
                     who(), i);
  }
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
    // Not a view but a tensor on shardGrad's storage: an optimizer's
    // zero_grad() detaches gradients in place, which views refuse.
    pieces.back().mutable_grad() = at::empty({0}, shardGrad.options())
                                       .set_(shardGrad.storage(), shardGrad.storage_offset() + piece.shardOffset,
                                             {piece.length}, {1});
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
  if (grad.is_sparse()) failSparseGradient(i);
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
  struct Reset {  // also when a collective fails: the next backward starts clean
    Impl& s;
    ~Reset() {
      std::fill(s.arrived.begin(), s.arrived.end(), 0);
      s.nextLaunch = 0;
      s.inFlight.clear();
      for (auto& t : s.staging) t.reset();
      for (auto& t : s.scratch) t.reset();
    }
  } reset{*this};
  while (nextLaunch < arrived.size()) launchBucketLocked(nextLaunch++);
  while (!inFlight.empty()) finishOldestLocked();
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
      if (g.is_sparse()) failSparseGradient(i);
      // Something replaced the gradient tensor (an optimizer's zero_grad
      // with set_to_none, or a hook): take its values back into the buffer.
      if (g.data_ptr() != gradViews[i].data_ptr()) gradViews[i].copy_(g);
    }
    // A gradient reset to none (zero_grad with set_to_none) restarts from
    // zero, as it would without this buffer.
    if (!g.defined()) gradViews[i].zero_();
    params[i].mutable_grad() = gradViews[i];
  }
}

// The pieces' optimizer state, gathered into each trainable parameter's
// full state on rank 0 (null elsewhere). Each parameter's state is decided
// by the rank that owns its first element: whether it has state, which
// per-element values (tensors shaped like the piece, gathered in their own
// dtype) and which scalar values (ints and doubles, such as Adam's step)
// it holds. Other values come from a state on rank 0 of the same
// optimizer, which is also the type a parameter's state is rebuilt as.
std::unique_ptr<StateMap> ZeroStrategy::Impl::gatherFullStates() {
  const size_t P = params.size();
  std::vector<StateEntries> mine(P);
  std::vector<bool> hasState(P, false);
  for (size_t i = 0; i < P; ++i) {
    if (!pieces[i].defined()) continue;
    auto it = optimizer->state().find(stateKey(pieces[i]));
    if (it == optimizer->state().end()) continue;
    mine[i] = stateEntries(*it->second);
    hasState[i] = true;
  }
  // The union of value names over all ranks: "t<dtype> key" per element,
  // "i key" / "d key" scalars.
  std::set<std::string> names;
  for (size_t i = 0; i < P; ++i) {
    for (const auto& [key, value] : mine[i]) {
      if (value.isTensor() && value.toTensor().dim() == 1 && value.toTensor().numel() == pieceInfo[i]->length) {
        names.insert("t" + std::to_string(static_cast<int>(value.toTensor().scalar_type())) + " " + key);
      } else if (value.isInt()) {
        names.insert("i " + key);
      } else if (value.isDouble()) {
        names.insert("d " + key);
      }
    }
  }
  std::string list;
  for (const auto& n : names) list += n + "\n";
  std::set<std::string> all;
  for (const std::string& text : allgatherStrings(*group, list, timeout)) {
    for (size_t at = 0, nl; (nl = text.find('\n', at)) != std::string::npos; at = nl + 1) all.insert(text.substr(at, nl - at));
  }
  const std::vector<std::string> columns(all.begin(), all.end());
  const size_t C = columns.size();

  // Per parameter, from the owner of its first element: has state, then
  // per name whether present and (scalars) its value. Summed over ranks.
  at::Tensor table = at::zeros({static_cast<int64_t>(P), static_cast<int64_t>(1 + 2 * C)}, at::kDouble);
  auto cell = table.accessor<double, 2>();
  for (size_t i = 0; i < P; ++i) {
    if (!pieceInfo[i] || pieceInfo[i]->paramOffset != 0 || !hasState[i]) continue;
    cell[i][0] = 1;
    for (const auto& [key, value] : mine[i]) {
      for (size_t c = 0; c < C; ++c) {
        const std::string& col = columns[c];
        if (col.substr(col.find(' ') + 1) != key) continue;
        if (col[0] == 't' && value.isTensor() && std::to_string(static_cast<int>(value.toTensor().scalar_type())) ==
                                                    col.substr(1, col.find(' ') - 1)) {
          cell[i][1 + 2 * c] = 1;
        } else if (col[0] == 'i' && value.isInt()) {
          cell[i][1 + 2 * c] = 1;
          cell[i][2 + 2 * c] = static_cast<double>(value.toInt());
        } else if (col[0] == 'd' && value.isDouble()) {
          cell[i][1 + 2 * c] = 1;
          cell[i][2 + 2 * c] = value.toDouble();
        }
      }
    }
  }
  if (world > 1 && table.numel() > 0) group->allreduce(table, {ReduceOp::Sum, timeout})->wait();

  // Per-element values: each rank's pieces in its shard, gathered.
  const int64_t S = shards->shardSize();
  std::map<std::string, at::Tensor> gathered;
  for (const std::string& col : columns) {
    if (col[0] != 't') continue;
    const auto dtype = static_cast<at::ScalarType>(std::stoi(col.substr(1, col.find(' ') - 1)));
    const std::string key = col.substr(col.find(' ') + 1);
    at::Tensor shard = at::zeros({S}, flatParam.options().dtype(dtype));
    for (size_t i = 0; i < P; ++i) {
      for (const auto& [k, value] : mine[i]) {
        if (k == key && value.isTensor() && value.toTensor().scalar_type() == dtype &&
            value.toTensor().numel() == pieceInfo[i]->length)
          shard.narrow(0, pieceInfo[i]->shardOffset, pieceInfo[i]->length).copy_(value.toTensor());
      }
    }
    at::Tensor whole = at::empty({S * world}, shard.options());
    group->allgather(shard, whole, {timeout})->wait();
    if (rank == 0) gathered[col] = whole;
  }
  if (rank != 0) return nullptr;

  auto states = std::make_unique<StateMap>();
  bool anyState = false;
  for (size_t i = 0; i < P; ++i) anyState = anyState || cell[i][0] > 0;
  if (!anyState) return states;  // no step taken yet
  // A state of this optimizer on rank 0, for its type and other values.
  const OptimizerParamState* templ = nullptr;
  for (const auto& [key, state] : optimizer->state()) {
    templ = state.get();
    break;
  }
  if (!templ) {
    fail<UsageError>("{}: rank 0 holds no optimizer state while other ranks do (only some parameters are "
                     "trained?), so it cannot write the checkpoint's optimizer. HINT: train every parameter the "
                     "optimizer holds, or use distributed.strategy=ddp",
                     who());
  }
  StateEntries base;
  for (auto& [key, value] : stateEntries(*templ)) {
    bool known = false;
    for (const auto& col : columns) known = known || col.substr(col.find(' ') + 1) == key;
    if (!known) base.emplace_back(key, value);
  }
  for (size_t i = 0; i < P; ++i) {
    if (cell[i][0] == 0) continue;
    StateEntries entries = base;
    for (size_t c = 0; c < C; ++c) {
      if (cell[i][1 + 2 * c] == 0) continue;
      const std::string& col = columns[c];
      const std::string key = col.substr(col.find(' ') + 1);
      if (col[0] == 'i') {
        entries.emplace_back(key, static_cast<int64_t>(cell[i][2 + 2 * c]));
      } else if (col[0] == 'd') {
        entries.emplace_back(key, cell[i][2 + 2 * c]);
      } else {
        // Rank r's piece of parameter i sits in rank r's shard of the gathered tensor.
        std::vector<at::Tensor> parts;
        for (int r = 0; r < world; ++r) {
          if (auto piece = shards->pieceOf(i, r))
            parts.push_back(gathered[col].narrow(0, r * S + piece->shardOffset, piece->length));
        }
        entries.emplace_back(key, at::cat(parts).view(params[i].sizes()).clone());
      }
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
  if (impl_->stage == 1) {
    loss.backward();
    return;
  }
  // zero2 reduces every micro-batch (it keeps no full gradient to
  // accumulate into); its shard sums them. If backward fails, the buckets
  // still go (peers are waiting for them) and the counts are reset before
  // the error goes on.
  try {
    loss.backward();
  } catch (...) {
    try {
      impl_->flushBuckets();
    } catch (...) {
    }
    throw;
  }
  impl_->flushBuckets();
}

void ZeroStrategy::step() {
  Impl& s = *impl_;
  const auto& buckets = s.shards->buckets();
  // model.load() or module->to() after construction gives a parameter new
  // storage: the allgathers would no longer reach it.
  const char* flat = static_cast<const char*>(s.flatParam.data_ptr());
  const int64_t elementSize = static_cast<int64_t>(s.flatParam.element_size());
  for (size_t i = 0; i < s.params.size(); ++i) {
    if (s.params[i].numel() > 0 && s.params[i].data_ptr() != flat + s.shards->offset(i) * elementSize) {
      fail<UsageError>("{}: parameter #{} no longer lives in the strategy's flat buffer (a model.load() or "
                       "module->to() after the strategy was built?). HINT: load or move the model before "
                       "creating the strategy",
                       s.who(), i);
    }
  }
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
  std::vector<at::Tensor> grads = {s.flatGrad, s.shardGrad};
  grads.insert(grads.end(), s.staging.begin(), s.staging.end());
  return countHeldBytes({s.flatParam}, std::move(grads));
}

void ZeroStrategy::saveState(torch::serialize::OutputArchive* archive) {
  Impl& s = *impl_;
  std::unique_ptr<StateMap> full = s.gatherFullStates();
  if (!archive) return;
  // Write as one process holding the full parameters would: swap the full
  // parameters and their state in, save, swap the pieces back.
  auto& groups = s.optimizer->param_groups();
  StateMap pieceStates = std::move(s.optimizer->state());
  // Parameters the optimizer holds that this strategy does not shard (they
  // do not require grad) keep their own state.
  std::set<std::string> pieceKeys;
  for (const auto& piece : s.pieces)
    if (piece.defined()) pieceKeys.insert(stateKey(piece));
  for (const auto& [key, state] : pieceStates)
    if (!pieceKeys.count(key)) (*full)[key] = state->clone();
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
