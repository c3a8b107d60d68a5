#include "framework/parallel/strategy.hpp"

#include <fmt/format.h>
#include <torch/serialize.h>

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

std::unique_ptr<ParallelStrategy> StrategyRegistry::create(const std::string& name, StrategyContext context) const {
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
    r.add("ddp", [](StrategyContext c) -> std::unique_ptr<ParallelStrategy> {
      // One rank has nothing to synchronise: no DDP, no buckets.
      if (c.group->size() == 1) return std::make_unique<LocalStrategy>(std::move(c.model), std::move(c.optimizer));
      return std::make_unique<DdpStrategy>(std::move(c));
    });
    r.add("zero1", [](StrategyContext c) -> std::unique_ptr<ParallelStrategy> {
      return std::make_unique<ZeroStrategy>(std::move(c), 1);
    });
    r.add("zero2", [](StrategyContext c) -> std::unique_ptr<ParallelStrategy> {
      return std::make_unique<ZeroStrategy>(std::move(c), 2);
    });
    r.add("fsdp", [](StrategyContext c) -> std::unique_ptr<ParallelStrategy> {
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
