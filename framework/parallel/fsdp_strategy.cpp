#include "framework/parallel/fsdp_strategy.hpp"


#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "framework/core/errors.hpp"
#include "framework/core/malloc_tuning.hpp"
#include "framework/parallel/flat_shards.hpp"
#include "framework/parallel/grad_ready_hooks.hpp"
#include "framework/parallel/model_sync.hpp"
#include "framework/parallel/shard_grad_reducer.hpp"
#include "framework/parallel/sharded_optimizer.hpp"
#include "framework/parallel/sharding_units.hpp"

namespace ddp {

namespace {

// A tensor's memory is released and restored under the same storage, so
// the views of it (the parameters) and the tensors autograd saved from
// them see the memory again once it is restored and refilled.
void releaseMemory(const at::Tensor& t) { t.storage().unsafeGetStorageImpl()->reset(); }

// On the CPU a unit's memory is mapped for it and unmapped on release:
// through malloc, a released buffer smaller than glibc's mmap threshold
// stays resident (freed chunks inside the heap are not returned), and the
// process grew by the units' size within a few steps.
struct Mapping {
  void* address;
  size_t bytes;
};

void unmap(void* context) {
  auto* m = static_cast<Mapping*>(context);
  munmap(m->address, m->bytes);
  delete m;
}

c10::DataPtr mapCpuMemory(size_t nbytes) {
  void* address = mmap(nullptr, nbytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (address == MAP_FAILED) {
    fail<std::runtime_error>("fsdp: cannot map {} bytes for a unit's parameters: {}", nbytes, std::strerror(errno));
  }
  return c10::DataPtr(address, new Mapping{address, nbytes}, &unmap, c10::Device(c10::kCPU));
}

void restoreMemory(const at::Tensor& t) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  const size_t nbytes = static_cast<size_t>(t.numel()) * t.element_size();
  if (storage->nbytes() == nbytes) return;
  storage->set_data_ptr_noswap(t.is_cpu() && nbytes > 0 ? mapCpuMemory(nbytes) : storage->allocator()->allocate(nbytes));
  storage->set_nbytes(nbytes);
}

// fsdpUnitOf, and per unit the model names, the group it joins.
struct UnitGroups {
  std::vector<int> ofParameter;  // per trainable parameter; -1: the root
  std::vector<int> ofUnit;       // per unit of shardingUnits()
};

UnitGroups unitGroups(torch::nn::Module& model, int64_t unitBytes) {
  auto* seam = dynamic_cast<ShardingUnits*>(&model);
  std::vector<std::shared_ptr<torch::nn::Module>> unitModules;
  if (seam) unitModules = seam->shardingUnits();
  // A parameter belongs to a unit when every name the model registers it
  // under lies inside that unit; the rest (shared by two units, or also
  // registered outside them, as a tied weight can be) to the root.
  std::unordered_map<const void*, int> names;  // registrations in the whole model
  for (const auto& item : model.named_parameters()) ++names[item.value().unsafeGetTensorImpl()];
  std::unordered_map<const void*, int> unitOfParam;
  for (size_t u = 0; u < unitModules.size(); ++u) {
    std::unordered_map<const void*, int> inUnit;
    for (const auto& item : unitModules[u]->named_parameters()) ++inUnit[item.value().unsafeGetTensorImpl()];
    for (const auto& [impl, count] : inUnit)
      if (count == names[impl]) unitOfParam.emplace(impl, static_cast<int>(u));
  }
  std::vector<int> unitOf;
  std::vector<int64_t> bytes(unitModules.size(), 0);
  for (auto& [name, p] : uniqueParameters(model)) {
    if (!p.requires_grad()) continue;
    auto it = unitOfParam.find(p.unsafeGetTensorImpl());
    unitOf.push_back(it != unitOfParam.end() ? it->second : -1);
    if (unitOf.back() >= 0) bytes[unitOf.back()] += p.numel() * static_cast<int64_t>(p.element_size());
  }
  // Consecutive units joined until each group holds at least unitBytes
  // (the last may hold less). A unit without trainable parameters joins
  // the group before it (the first such, the one after), so no group is
  // empty.
  UnitGroups out;
  out.ofUnit.assign(unitModules.size(), 0);
  int group = 0;
  int64_t held = 0;
  for (size_t u = 0; u < unitModules.size(); ++u) {
    if (held > 0 && held >= unitBytes && bytes[u] > 0) {
      ++group;
      held = 0;
    }
    out.ofUnit[u] = group;
    held += bytes[u];
  }
  for (int& u : unitOf)
    if (u >= 0) u = out.ofUnit[u];
  out.ofParameter = std::move(unitOf);
  return out;
}

}  // namespace

std::vector<int> fsdpUnitOf(torch::nn::Module& model, int64_t unitBytes) {
  return unitGroups(model, unitBytes).ofParameter;
}

struct FsdpStrategy::Impl : UnitHooks {
  std::shared_ptr<torch::nn::Module> model;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  ProcessGroupPtr group;
  ProcessGroupPtr replicate;  // hsdp: the ranks holding this rank's shard too; null under fsdp
  Milliseconds timeout;
  int64_t bucketCapBytes = 0;
  bool backwardPrefetch = true;
  int rank = 0, world = 1;
  ShardingUnits* seam = nullptr;

  std::vector<at::Tensor> params;  // trainable, in flat order
  std::vector<at::Tensor> buffers;
  std::optional<FlatShards> shards;
  // Groups 0 .. units-1 are the model's units (joined up to
  // fsdp.unitBytes); group `units` is the root.
  size_t units = 0;
  int64_t unitBytes = 0;
  std::vector<size_t> groupOfUnit;  // per unit the model names
  std::vector<size_t> lastUnitOf;   // per group: the last unit of it to run
  struct Group {
    size_t paramCount = 0;
    size_t firstBucket = 0, endBucket = 0;
    int64_t offset = 0, length = 0;  // the flat range of its buckets, padded
    at::Tensor full;                 // its parameters' memory (they are views of it)
    std::vector<WorkPtr> pending;    // its allgathers in flight
    bool gathered = false;
    size_t arrived = 0;  // gradients that arrived in this backward
  };
  std::vector<Group> groups;
  std::vector<size_t> groupOf;  // per parameter
  at::Tensor shardParam, shardGrad;
  std::vector<at::Tensor> pieces;
  std::unique_ptr<ShardedOptimizer> sharded;
  std::unique_ptr<ShardGradReducer> reducer;
  std::unique_ptr<GradReadyHooks> hooks;
  std::mutex mutex;  // the groups' state; hooks run on autograd's threads
  int pinned = 0;    // withFullParameters() calls running: nothing is released

  ~Impl() override {
    hooks.reset();
    if (seam) seam->setUnitHooks(nullptr);
  }

  void build();
  bool isUnit(const Group& g) const { return &g != &groups[units]; }
  // Rank 0's tensors on every rank: under hsdp down its column (row 0 of
  // each column holds its values then), then along every row.
  void broadcastAll(std::vector<at::Tensor>& tensors) {
    if (replicate && replicate->size() > 1) broadcastFromRankZero(*replicate, tensors, timeout);
    if (group->size() > 1) broadcastFromRankZero(*group, tensors, timeout);
  }

  void startGatherLocked(Group& g) {
    if (g.gathered || !g.pending.empty() || g.length == 0) return;
    restoreMemory(g.full);
    for (size_t b = g.firstBucket; b < g.endBucket; ++b) {
      const FlatShards::Bucket& bucket = shards->buckets()[b];
      at::Tensor whole = g.full.narrow(0, bucket.offset - g.offset, bucket.padded(world));
      g.pending.push_back(group->allgather(shardParam.narrow(0, bucket.shardOffset, bucket.slice), whole, {timeout}));
    }
  }
  void finishGatherLocked(Group& g) {
    startGatherLocked(g);
    // Cleared first: a failed wait leaves no stale work behind.
    std::vector<WorkPtr> works = std::move(g.pending);
    g.pending.clear();
    for (auto& w : works) w->wait();
    g.gathered = true;
  }
  void releaseLocked(Group& g) {
    if (!isUnit(g) || pinned > 0) return;
    std::vector<WorkPtr> works = std::move(g.pending);
    g.pending.clear();
    for (auto& w : works) w->wait();  // a prefetch nobody used: the memory is being written
    releaseMemory(g.full);
    g.gathered = false;
  }
  void releaseUnitsLocked() {
    for (size_t u = 0; u < units; ++u) releaseLocked(groups[u]);
  }
  // After a failure: every unit marked not gathered (the next use gathers
  // it again), nothing waited for; the memory goes with the works' end.
  void forgetUnitsLocked() noexcept {
    for (size_t u = 0; u < units; ++u) {
      groups[u].pending.clear();
      groups[u].gathered = false;
      groups[u].arrived = 0;
    }
  }

  // UnitHooks: what runUnit() calls.
  // Unit u of the model is in group g = groupOfUnit[u].
  void beforeForward(size_t u) override {
    DDP_CHECK(u < groupOfUnit.size(),
              fmt::format("fsdp: the model ran unit {} but named {} unit(s)", u, groupOfUnit.size()));
    const size_t g = groupOfUnit[u];
    std::lock_guard<std::mutex> lock(mutex);
    finishGatherLocked(groups[g]);
    if (g + 1 < units) startGatherLocked(groups[g + 1]);  // prefetch
  }
  at::Tensor afterForward(size_t u, at::Tensor output) override {
    const size_t g = groupOfUnit[u];
    std::lock_guard<std::mutex> lock(mutex);
    if (output.defined() && output.has_storage() && groups[g].full.numel() > 0 &&
        output.storage().is_alias_of(groups[g].full.storage())) {
      fail<UsageError>("fsdp: unit {} returned a view of its own parameters, whose memory is released after the "
                       "unit runs. HINT: return a computed tensor (x + p, not p.narrow(...)), or leave that "
                       "module out of shardingUnits()",
                       u);
    }
    if (u == lastUnitOf[g]) releaseLocked(groups[g]);
    // Backward needs the unit again: gather it when the gradient of its
    // output is ready, that is, just before backward enters the unit.
    if (output.requires_grad()) {
      output.register_hook([this, g](const at::Tensor&) {
        std::lock_guard<std::mutex> lock(mutex);
        finishGatherLocked(groups[g]);
        if (g > 0 && backwardPrefetch) startGatherLocked(groups[g - 1]);  // in backward's order
      });
    }
    return output;
  }

  void onGradient(size_t i) {
    reducer->add(i);
    std::lock_guard<std::mutex> lock(mutex);
    Group& g = groups[groupOf[i]];
    // A unit whose gradients have all arrived is done with its parameters.
    if (++g.arrived == g.paramCount) releaseLocked(g);
  }

  void afterBackward() {
    try {
      reducer->flush();
      std::lock_guard<std::mutex> lock(mutex);
      releaseUnitsLocked();
      for (auto& g : groups) g.arrived = 0;
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex);
      forgetUnitsLocked();
      throw;
    }
  }

  void gatherAllLocked() {
    for (size_t u = 0; u < units; ++u) startGatherLocked(groups[u]);
    for (size_t u = 0; u < units; ++u) finishGatherLocked(groups[u]);
  }
};

void FsdpStrategy::Impl::build() {
  rank = group->rank();
  world = group->size();
  at::NoGradGuard noGrad;
  verifySameModel(*group, *model, replicate ? "hsdp" : "fsdp", timeout);
  if (replicate) verifySameModel(*replicate, *model, "hsdp", timeout);
  auto named = shardableParameters(*model, "fsdp");

  seam = dynamic_cast<ShardingUnits*>(model.get());
  const UnitGroups layout = unitGroups(*model, unitBytes);
  const std::vector<int>& unitOf = layout.ofParameter;
  groupOfUnit.assign(layout.ofUnit.begin(), layout.ofUnit.end());
  units = groupOfUnit.empty() ? 0 : groupOfUnit.back() + 1;
  lastUnitOf.assign(units, 0);
  for (size_t u = 0; u < groupOfUnit.size(); ++u) lastUnitOf[groupOfUnit[u]] = u;
  std::vector<int64_t> numels;
  std::vector<int> flatGroups;
  groups.resize(units + 1);
  for (size_t k : unitMajorOrder(unitOf)) {
    const at::Tensor& p = named[k].second;
    params.push_back(p);
    numels.push_back(p.numel());
    groupOf.push_back(unitOf[k] < 0 ? units : static_cast<size_t>(unitOf[k]));
    flatGroups.push_back(static_cast<int>(groupOf.back()));
    ++groups[groupOf.back()].paramCount;
  }
  for (auto& [name, b] : uniqueBuffers(*model)) buffers.push_back(b);
  const auto options = params.empty() ? at::TensorOptions(at::kFloat) : params.front().options().requires_grad(false);
  const int64_t elementSize = static_cast<int64_t>(c10::elementSize(options.dtype().toScalarType()));
  shards.emplace(numels, world, std::max<int64_t>(1, bucketCapBytes / elementSize), flatGroups);
  // Rank 0's parameters and buffers everywhere, as DDP starts.
  std::vector<at::Tensor> everything(params.begin(), params.end());
  for (auto& [name, p] : uniqueParameters(*model))
    if (!p.requires_grad()) everything.push_back(p);
  everything.insert(everything.end(), buffers.begin(), buffers.end());
  broadcastAll(everything);
  // After the broadcast, whose staging is as large as the model.
  shardParam = at::zeros({shards->shardSize()}, options);
  shardGrad = at::zeros({shards->shardSize()}, options);

  // Each group's buckets, and its flat range.
  const auto& buckets = shards->buckets();
  for (size_t b = 0; b < buckets.size(); ++b) {
    Group& g = groups[groupOf[buckets[b].firstParam]];
    if (g.endBucket == 0) {
      g.firstBucket = b;
      g.offset = buckets[b].offset;
    }
    g.endBucket = b + 1;
    g.length = buckets[b].offset + buckets[b].padded(world) - g.offset;
  }
  // Group by group, so that at most one unit's buffer exists besides the
  // model as built: this rank's pieces go to its shard, the parameters
  // become views of their group's buffer (their autograd identity is kept,
  // their own memory is freed), and a unit's buffer is released at once.
  pieces.resize(params.size());
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    Group& g = groups[gi];
    g.full = at::zeros({g.length}, options);
    for (size_t i = 0; i < params.size(); ++i) {
      if (groupOf[i] != gi) continue;
      at::Tensor& p = params[i];
      const at::Tensor flat = p.detach().reshape({-1});
      if (auto piece = shards->pieceOf(i, rank)) {
        pieces[i] = shardParam.narrow(0, piece->shardOffset, piece->length);
        pieces[i].copy_(flat.narrow(0, piece->paramOffset, piece->length));
        // On shardGrad's storage, not a view: an optimizer's zero_grad()
        // detaches gradients in place, which views refuse.
        pieces[i].mutable_grad() = at::empty({0}, shardGrad.options())
                                       .set_(shardGrad.storage(), shardGrad.storage_offset() + piece->shardOffset,
                                             {piece->length}, {1});
      }
      at::Tensor slot = g.full.narrow(0, shards->offset(i) - g.offset, p.numel());
      slot.copy_(flat);
      p.set_data(slot.view(p.sizes()));
      p.mutable_grad().reset();
    }
    if (isUnit(g)) releaseLocked(g);
  }
  groups[units].gathered = true;  // the root stays whole

  // Each bucket is waited for as soon as it is sent: a unit's gradients are
  // as large as the unit, and keeping one in flight while the next unit's
  // backward runs held 64 MiB more and was slower on 2 cores (1.21x ddp's
  // step against 0.97x, docs/performance.md).
  reducer = std::make_unique<ShardGradReducer>(params, *shards, *group, timeout, shardGrad, "fsdp",
                                               /*maxInFlight=*/0);
  hooks = std::make_unique<GradReadyHooks>(params, [this](size_t i) { onGradient(i); });
  sharded = std::make_unique<ShardedOptimizer>(*optimizer, params, pieces, *shards, *group, timeout, "fsdp");
  if (seam) seam->setUnitHooks(this);
  returnFreedMemory();  // the model's own parameters, now in the shards
}

FsdpStrategy::FsdpStrategy(StrategyContext context) : impl_(std::make_unique<Impl>()) {
  impl_->bucketCapBytes = static_cast<int64_t>(context.ddp.bucketCapBytes);
  impl_->model = std::move(context.model);
  impl_->optimizer = std::move(context.optimizer);
  impl_->group = std::move(context.group);
  impl_->replicate = std::move(context.replicateGroup);
  impl_->timeout = context.ddp.timeout;
  impl_->backwardPrefetch = context.fsdp.backwardPrefetch;
  impl_->unitBytes = context.fsdp.unitBytes;
  impl_->build();
}

FsdpStrategy::~FsdpStrategy() = default;

torch::nn::Module& FsdpStrategy::model() { return *impl_->model; }
torch::optim::Optimizer& FsdpStrategy::optimizer() { return *impl_->optimizer; }
bool FsdpStrategy::collectiveForward() const { return impl_->units > 0; }
const char* FsdpStrategy::name() const { return impl_->replicate ? "hsdp" : "fsdp"; }

void FsdpStrategy::backward(const at::Tensor& loss, bool /*lastMicroBatch*/) {
  // Every micro-batch reduces (no full gradient is kept to accumulate
  // into); the shard sums them. A backward that fails leaves the ranks at
  // different points of their gathers, which no further collective can
  // line up again: the error goes on at once, the units marked empty.
  try {
    loss.backward();
  } catch (...) {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->forgetUnitsLocked();
    throw;
  }
  impl_->afterBackward();
}

void FsdpStrategy::step() {
  Impl& s = *impl_;
  // model.load() or a set_() after construction gives a parameter storage
  // of its own: the gathers would no longer reach it.
  for (size_t i = 0; i < s.params.size(); ++i) {
    const Impl::Group& g = s.groups[s.groupOf[i]];
    if (!s.params[i].storage().is_alias_of(g.full.storage())) {
      fail<UsageError>("fsdp: parameter #{} no longer lives in the strategy's unit buffer (a model.load() or "
                       "module->to() after the strategy was built?). HINT: load or move the model before "
                       "creating the strategy",
                       i);
    }
  }
  // hsdp: the row's averaged shard, averaged again over the replicas that
  // hold the same shard (their rows saw other data).
  if (s.replicate && s.replicate->size() > 1) {
    AllreduceOptions average;
    average.op = ReduceOp::Avg;
    average.timeout = s.timeout;
    s.replicate->allreduce(s.shardGrad, average)->wait();
  }
  clipGradients(s.group.get(), s.timeout);
  s.optimizer->step();
  // The root, whole again from every rank's updated slices.
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    Impl::Group& root = s.groups[s.units];
    root.gathered = false;
    s.finishGatherLocked(root);
  }
  s.shardGrad.zero_();
  s.reducer->shardZeroed();
  if (!s.buffers.empty()) s.broadcastAll(s.buffers);
}

void FsdpStrategy::withFullParameters(const std::function<void()>& fn) {
  Impl& s = *impl_;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    try {
      s.gatherAllLocked();
    } catch (...) {
      s.forgetUnitsLocked();
      throw;
    }
    ++s.pinned;  // a forward inside fn must not release them
  }
  struct Release {
    Impl& s;
    ~Release() {
      std::lock_guard<std::mutex> lock(s.mutex);
      --s.pinned;
      try {
        s.releaseUnitsLocked();
      } catch (...) {
        s.forgetUnitsLocked();
      }
    }
  } release{s};
  fn();
}

HeldState FsdpStrategy::heldState() {
  Impl& s = *impl_;
  const int pieceReplicas = s.replicate ? s.replicate->size() : 1;
  const int pieceReplica = s.replicate ? s.replicate->rank() : 0;
  const int wholeReplicas = s.world * pieceReplicas, wholeReplica = pieceReplica * s.world + s.rank;
  std::unordered_map<const void*, size_t> trainable;
  for (size_t i = 0; i < s.params.size(); ++i) trainable[s.params[i].unsafeGetTensorImpl()] = i;
  // A unit's parameter has no memory between steps: its piece in this
  // rank's shard stands for it.
  HeldState held;
  for (const auto& item : s.model->named_parameters()) {
    auto it = trainable.find(item.value().unsafeGetTensorImpl());
    if (it == trainable.end()) {
      held.model.push_back({item.key(), item.value().sizes().vec(), 0, item.value().detach().view({-1}), wholeReplicas,
                            wholeReplica});
      continue;
    }
    const size_t i = it->second;
    if (!s.pieces[i].defined()) continue;  // this rank owns none of it
    held.model.push_back({item.key(), item.value().sizes().vec(), s.shards->pieceOf(i, s.rank)->paramOffset,
                          s.pieces[i].detach().view({-1}), pieceReplicas, pieceReplica});
  }
  for (const auto& item : s.model->named_buffers()) {
    held.model.push_back({item.key(), item.value().sizes().vec(), 0, item.value().detach().view({-1}), wholeReplicas,
                          wholeReplica});
  }
  held.optimizer = s.sharded->heldTensors(*s.model, pieceReplicas, pieceReplica, wholeReplicas, wholeReplica);
  return held;
}

void FsdpStrategy::afterStateLoaded() {
  Impl& s = *impl_;
  std::lock_guard<std::mutex> lock(s.mutex);
  Impl::Group& root = s.groups[s.units];
  root.gathered = false;
  s.finishGatherLocked(root);
}

void FsdpStrategy::saveState(torch::serialize::OutputArchive* archive) {
  Impl& s = *impl_;
  // The archive keeps the tensors it is given until it is written out,
  // after the units are released again: it gets copies, taken unit by unit
  // (one unit whole at a time besides rank 0's copy of the model).
  TensorCopies copies;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    try {
      for (size_t u = 0; u < s.units; ++u) {
        s.finishGatherLocked(s.groups[u]);
        if (archive) {
          for (size_t i = 0; i < s.params.size(); ++i)
            if (s.groupOf[i] == u) copies[s.params[i].unsafeGetTensorImpl()] = s.params[i].detach().clone();
        }
        s.releaseLocked(s.groups[u]);
      }
    } catch (...) {
      s.forgetUnitsLocked();
      throw;
    }
  }
  s.sharded->save(archive, *s.model, &copies);
}

ParallelStrategy::HeldBytes FsdpStrategy::heldBytes() {
  Impl& s = *impl_;
  std::vector<at::Tensor> held = {s.shardParam};
  for (const auto& g : s.groups) held.push_back(g.full);
  std::vector<at::Tensor> grads = s.reducer->staging();
  grads.push_back(s.shardGrad);
  return countHeldBytes(std::move(held), std::move(grads));
}

}  // namespace ddp
