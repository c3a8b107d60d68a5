#include "framework/parallel/strategy.hpp"

#include <fmt/format.h>
#include <torch/serialize.h>
#include <ATen/ATen.h>

#include <cmath>

#include <unordered_set>

#include "framework/core/errors.hpp"
#include "framework/parallel/ddp_strategy.hpp"
#include "framework/parallel/local_strategy.hpp"
#include "framework/parallel/optimizer_state.hpp"
#include "framework/parallel/fsdp_strategy.hpp"
#include "framework/parallel/zero_strategy.hpp"

namespace ddp {

void ParallelStrategy::shadowBackward() {
  fail<UsageError>("strategy {} cannot shadow a step for a rank without a batch (uneven inputs). HINT: set "
                   "training.join=false to pad the shards instead, or use distributed.strategy=ddp",
                   name());
}

std::unique_ptr<torch::optim::Optimizer> ParallelStrategy::releaseOptimizer() {
  fail<UsageError>("strategy {} cannot recover in place from a lost rank (its optimizer state is sharded). HINT: "
                   "distributed.strategy=ddp with --min-ranks, or --max-restarts without it",
                   name());
}

void ParallelStrategy::setGradientClipping(double maxNorm) {
  if (maxNorm > 0 && !supportsGradientClipping()) {
    fail<UsageError>("training.clip_grad_norm: strategy {} does not clip gradients (its step() does not call "
                     "clipGradients). HINT: --set training.clip_grad_norm=0, or a built-in strategy",
                     name());
  }
  clipNorm_ = maxNorm;
}

void ParallelStrategy::clipGradients(ProcessGroup* shardGroup, Milliseconds timeout) {
  if (clipNorm_ <= 0) return;
  std::vector<at::Tensor> grads;
  for (auto& group : optimizer().param_groups()) {
    for (auto& p : group.params()) {
      if (p.grad().defined()) grads.push_back(p.grad());
    }
  }
  // Sums of squares in double, on the gradients' device (a rank without a
  // piece still takes part in the allreduce, with zero).
  at::Device device = at::kCPU;
  if (!grads.empty()) {
    device = grads.front().device();
  } else {
    for (const auto& p : model().parameters()) {
      device = p.device();
      break;
    }
  }
  at::Tensor squares = at::zeros({1}, at::TensorOptions().dtype(at::kDouble).device(device));
  for (const at::Tensor& g : grads) {
    if (g.numel() == 0) continue;
    squares.add_(at::linalg_vector_norm(g, 2, c10::nullopt, false, at::kDouble).square());
  }
  if (shardGroup != nullptr && shardGroup->size() > 1) {
    shardGroup->allreduce(squares, {ReduceOp::Sum, timeout})->wait();
  }
  const double norm = std::sqrt(squares.item<double>());
  lastGradNorm_ = norm;
  const double scale = clipNorm_ / (norm + 1e-6);
  if (scale < 1.0) {
    for (at::Tensor& g : grads) g.mul_(scale);
  }
}

void StrategyRegistry::add(const std::string& name, StrategyFactory factory) {
  if (!factories_.emplace(name, std::move(factory)).second) {
    fail<UsageError>("parallel strategy \"{}\" is registered twice", name);
  }
}

std::vector<std::string> StrategyRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& [name, factory] : factories_) out.push_back(name);
  return out;
}

std::unique_ptr<ParallelStrategy> StrategyRegistry::create(const std::string& name, StrategyContext&& context) const {
  auto it = factories_.find(name);
  if (it == factories_.end()) {
    std::string known;
    for (const auto& [n, factory] : factories_) known += (known.empty() ? "\"" : ", \"") + n + "\"";
    fail<UsageError>("unknown parallel strategy \"{}\" (known: {}). HINT: --set distributed.strategy=ddp", name, known);
  }
  if (!context.model || !context.optimizer || !context.group) {
    fail<UsageError>("parallel strategy \"{}\": the model, optimizer and process group must be given", name);
  }
  return it->second(std::move(context));
}

int64_t storageBytes(const std::vector<at::Tensor>& tensors) {
  std::unordered_set<const void*> seen;
  int64_t bytes = 0;
  for (const at::Tensor& t : tensors) {
    if (!t.defined() || !t.has_storage()) continue;
    if (seen.insert(t.storage().unsafeGetStorageImpl()).second) bytes += static_cast<int64_t>(t.storage().nbytes());
  }
  return bytes;
}

ParallelStrategy::HeldBytes ParallelStrategy::countHeldBytes(std::vector<at::Tensor> params,
                                                             std::vector<at::Tensor> grads) {
  HeldBytes held;
  for (const at::Tensor& p : model().parameters()) {
    params.push_back(p);
    grads.push_back(p.grad());
  }
  held.parameters = storageBytes(params);
  held.gradients = storageBytes(grads);
  held.optimizerState = optimizerStateBytes(optimizer());
  return held;
}

StrategyRegistry& builtinStrategies() {
  static StrategyRegistry registry = [] {
    StrategyRegistry r;
    r.add("ddp", [](StrategyContext&& c) -> std::unique_ptr<ParallelStrategy> {
      // One rank has nothing to synchronise: no DDP, no buckets.
      if (c.group->size() == 1) return std::make_unique<LocalStrategy>(std::move(c.model), std::move(c.optimizer));
      return std::make_unique<DdpStrategy>(std::move(c));
    });
    r.add("zero1", [](StrategyContext&& c) -> std::unique_ptr<ParallelStrategy> {
      return std::make_unique<ZeroStrategy>(std::move(c), 1);
    });
    r.add("zero2", [](StrategyContext&& c) -> std::unique_ptr<ParallelStrategy> {
      return std::make_unique<ZeroStrategy>(std::move(c), 2);
    });
    r.add("fsdp", [](StrategyContext&& c) -> std::unique_ptr<ParallelStrategy> {
      c.replicateGroup.reset();
      return std::make_unique<FsdpStrategy>(std::move(c));
    });
    r.add("hsdp", [](StrategyContext&& c) -> std::unique_ptr<ParallelStrategy> {
      if (!c.replicateGroup) {
        fail<UsageError>("strategy hsdp needs a rank mesh: StrategyContext::group a row of it, replicateGroup "
                         "its column (the trainer builds them from distributed.shard_size)");
      }
      return std::make_unique<FsdpStrategy>(std::move(c));
    });
    return r;
  }();
  return registry;
}

namespace {
// Module::save's layout, with copies of the tensors.
void saveCopies(const torch::nn::Module& module, torch::serialize::OutputArchive& archive, const TensorCopies& copies) {
  auto copyOf = [&](const at::Tensor& t) {
    auto it = copies.find(t.unsafeGetTensorImpl());
    return it != copies.end() ? it->second : t.detach().clone();
  };
  for (const auto& p : module.named_parameters(/*recurse=*/false)) archive.write(p.key(), copyOf(p.value()));
  for (const auto& b : module.named_buffers(/*recurse=*/false))
    archive.write(b.key(), copyOf(b.value()), /*is_buffer=*/true);
  for (const auto& child : module.named_children()) {
    if (!child.value()->is_serializable()) continue;
    torch::serialize::OutputArchive childArchive(archive.compilation_unit());
    saveCopies(*child.value(), childArchive, copies);
    archive.write(child.key(), childArchive);
  }
}
}  // namespace

HeldState ParallelStrategy::heldState() { return wholeHeldState(model(), optimizer(), 1, 0); }

void saveModelAndOptimizer(torch::serialize::OutputArchive& archive, torch::nn::Module& model,
                           torch::optim::Optimizer& optimizer, const TensorCopies* copies) {
  torch::serialize::OutputArchive modelArchive, optimizerArchive;
  if (copies) {
    saveCopies(model, modelArchive, *copies);
  } else {
    model.save(modelArchive);
  }
  optimizer.save(optimizerArchive);
  archive.write("model", modelArchive);
  archive.write("optimizer", optimizerArchive);
}

void loadModelAndOptimizer(torch::serialize::InputArchive& archive, torch::nn::Module& model,
                           torch::optim::Optimizer& optimizer) {
  torch::serialize::InputArchive modelArchive, optimizerArchive;
  archive.read("model", modelArchive);
  archive.read("optimizer", optimizerArchive);
  model.load(modelArchive);
  optimizer.load(optimizerArchive);
}

}  // namespace ddp
