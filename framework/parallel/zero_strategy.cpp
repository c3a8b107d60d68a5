#include "framework/parallel/zero_strategy.hpp"


#include <algorithm>

#include "framework/core/errors.hpp"
#include "framework/core/malloc_tuning.hpp"
#include "framework/parallel/grad_ready_hooks.hpp"
#include "framework/parallel/model_sync.hpp"
#include "framework/parallel/shard_grad_reducer.hpp"
#include "framework/parallel/sharded_optimizer.hpp"

namespace ddp {

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
  std::vector<at::Tensor> pieces;     // params[i]'s piece (undefined where none)
  std::vector<at::Tensor> buffers;
  std::optional<FlatShards> shards;

  at::Tensor flatGrad, shardGrad, flatParam;  // flatGrad: stage 1 only

  // Stage 2: gradients go to their buckets as they arrive, and complete
  // buckets are reduce-scattered into shardGrad.
  std::unique_ptr<ShardGradReducer> reducer;
  std::unique_ptr<GradReadyHooks> hooks;
  std::unique_ptr<ShardedOptimizer> sharded;  // the optimizer on this rank's pieces

  void build();
  [[noreturn]] void failSparseGradient(size_t i) const {
    fail<UsageError>("{}: parameter #{} got a sparse gradient; it reduces dense gradients. HINT: use dense "
                     "embeddings (sparse=false) or distributed.strategy=ddp",
                     who(), i);
  }
  void syncGradientViews();
};

void ZeroStrategy::Impl::build() {
  rank = group->rank();
  world = group->size();
  at::NoGradGuard noGrad;
  verifySameModel(*group, *model, who(), timeout);
  std::vector<int64_t> numels;
  auto named = shardableParameters(*model, who());
  // zero2 reduces bucket by bucket while backward runs, which produces
  // gradients roughly from the last registered parameter to the first.
  if (stage == 2) std::reverse(named.begin(), named.end());
  for (auto& [name, p] : named) {
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
    const auto info = shards->pieceOf(i, rank);
    if (!info) {
      pieces.emplace_back();
      continue;
    }
    const auto& piece = *info;
    pieces.push_back(flatParam.narrow(0, shards->offset(i) + piece.paramOffset, piece.length));
    // Not a view but a tensor on shardGrad's storage: an optimizer's
    // zero_grad() detaches gradients in place, which views refuse.
    pieces.back().mutable_grad() = at::empty({0}, shardGrad.options())
                                       .set_(shardGrad.storage(), shardGrad.storage_offset() + piece.shardOffset,
                                             {piece.length}, {1});
  }
  if (stage == 2) {
    reducer = std::make_unique<ShardGradReducer>(params, *shards, *group, timeout, shardGrad, who());
    hooks = std::make_unique<GradReadyHooks>(params, [this](size_t i) { reducer->add(i); });
  }

  sharded = std::make_unique<ShardedOptimizer>(*optimizer, params, pieces, *shards, *group, timeout, who());
  returnFreedMemory();  // the model's own parameters, now in flatParam
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
      impl_->reducer->flush();
    } catch (...) {
    }
    throw;
  }
  impl_->reducer->flush();
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
  clipGradients(s.group.get(), s.timeout);
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
  if (s.stage == 2) {
    s.shardGrad.zero_();
    s.reducer->shardZeroed();
  }
  if (!s.buffers.empty() && s.world > 1) broadcastFromRankZero(*s.group, s.buffers, s.timeout);
}

ParallelStrategy::HeldBytes ZeroStrategy::heldBytes() {
  Impl& s = *impl_;
  std::vector<at::Tensor> grads = {s.flatGrad, s.shardGrad};
  if (s.reducer) {
    for (auto& t : s.reducer->staging()) grads.push_back(t);
  }
  return countHeldBytes({s.flatParam}, std::move(grads));
}

HeldState ZeroStrategy::heldState() {
  Impl& s = *impl_;
  HeldState held;
  held.model = wholeModel(*s.model, s.world, s.rank);
  held.optimizer = s.sharded->heldTensors(*s.model, 1, 0, s.world, s.rank);
  return held;
}

void ZeroStrategy::saveState(torch::serialize::OutputArchive* archive) {
  impl_->sharded->save(archive, *impl_->model);
}

}  // namespace ddp
