// What a rank holds of the training state (held_state.hpp).
#include "framework/parallel/held_state.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/optim.h>


#include "framework/core/errors.hpp"
#include "framework/parallel/optimizer_state.hpp"

namespace ddp {
namespace {

// This replica's part [begin, end) of n elements.
std::pair<int64_t, int64_t> replicaPart(int64_t n, int replicas, int replica) {
  return {n * replica / replicas, n * (replica + 1) / replicas};
}

at::Tensor flatView(const at::Tensor& t, const std::string& name) {
  DDP_CHECK(t.is_contiguous(), fmt::format("held state: tensor {} is not contiguous", name));
  return t.detach().view({-1});
}

// Each tensor of the optimizer's param groups, in order, with the held
// range it stands for (HeldState::optimizer lists them in the same order).
std::vector<std::pair<at::Tensor, const HeldTensor*>> optimizerTensors(const HeldState& held,
                                                                       torch::optim::Optimizer& optimizer) {
  std::vector<std::pair<at::Tensor, const HeldTensor*>> out;
  size_t i = 0;
  for (auto& group : optimizer.param_groups()) {
    for (const at::Tensor& p : group.params()) {
      DDP_CHECK(i < held.optimizer.size(), "held state: one entry per tensor of the optimizer's param groups");
      out.emplace_back(p, &held.optimizer[i++]);
    }
  }
  DDP_CHECK(i == held.optimizer.size(), "held state: one entry per tensor of the optimizer's param groups");
  return out;
}

}  // namespace

std::unordered_map<const void*, std::string> tensorNames(torch::nn::Module& model) {
  std::unordered_map<const void*, std::string> names;
  for (const auto& item : model.named_parameters()) names.emplace(item.value().unsafeGetTensorImpl(), item.key());
  for (const auto& item : model.named_buffers()) names.emplace(item.value().unsafeGetTensorImpl(), item.key());
  return names;
}

std::vector<HeldTensor> wholeModel(torch::nn::Module& model, int replicas, int replica) {
  std::vector<HeldTensor> held;
  for (const auto& item : model.named_parameters())
    held.push_back({item.key(), item.value().sizes().vec(), 0, flatView(item.value(), item.key()), replicas, replica});
  for (const auto& item : model.named_buffers())
    held.push_back({item.key(), item.value().sizes().vec(), 0, flatView(item.value(), item.key()), replicas, replica});
  return held;
}

HeldState wholeHeldState(torch::nn::Module& model, torch::optim::Optimizer& optimizer, int replicas, int replica) {
  HeldState held;
  held.model = wholeModel(model, replicas, replica);
  const auto names = tensorNames(model);
  for (auto& group : optimizer.param_groups()) {
    for (const at::Tensor& p : group.params()) {
      auto it = names.find(p.unsafeGetTensorImpl());
      if (it == names.end()) {
        fail<UsageError>("held state: the optimizer steps a tensor of shape [{}] that is not a parameter of the model",
                         fmt::join(p.sizes(), ","));
      }
      held.optimizer.push_back({it->second, p.sizes().vec(), 0, flatView(p, it->second), replicas, replica});
    }
  }
  return held;
}

std::vector<StateSlice> savedSlices(const HeldState& held, torch::optim::Optimizer& optimizer) {
  at::NoGradGuard noGrad;
  std::vector<StateSlice> out;
  const auto hostData = [](const at::Tensor& t) { return t.detach().to(at::kCPU); };
  // This rank's part of a held range (or of a state tensor of its extent).
  const auto addRange = [&](const std::string& name, const HeldTensor& h, const at::Tensor& flat) {
    const auto [begin, end] = replicaPart(flat.numel(), h.replicas, h.replica);
    if (end > begin) {
      out.push_back({name, h.shape, h.offset + begin, hostData(flat.narrow(0, begin, end - begin)), ""});
    } else if (flat.numel() == 0 && h.offset == 0 && h.replica == 0) {
      out.push_back({name, h.shape, 0, hostData(flat), ""});  // an empty tensor is still named
    }
  };
  for (const HeldTensor& h : held.model) addRange("model/" + h.name, h, h.data);

  const auto tensors = optimizerTensors(held, optimizer);
  for (const auto& [p, h] : tensors) {
    auto it = optimizer.state().find(stateKey(p));
    if (it == optimizer.state().end()) continue;  // no state yet (before the first step, or SGD without momentum)
    const bool writesWholeValues = h->offset == 0 && h->replica == 0;
    for (const auto& [key, value] : stateEntries(*it->second)) {
      const std::string name = "optimizer/" + h->name + "/" + key;
      if (value.isTensor()) {
        const at::Tensor t = value.toTensor();
        if (t.numel() == h->data.numel() && t.numel() > 0) {
          addRange(name, *h, t.contiguous().view({-1}));
        } else if (writesWholeValues) {
          out.push_back({name, t.sizes().vec(), 0, hostData(t.contiguous().view({-1})), ""});
        }
      } else if (writesWholeValues && value.isInt()) {
        out.push_back({name, {}, 0, at::tensor({value.toInt()}, at::kLong), "int"});
      } else if (writesWholeValues && value.isDouble()) {
        out.push_back({name, {}, 0, at::tensor({value.toDouble()}, at::kDouble), "double"});
      } else if (writesWholeValues && value.isBool()) {
        out.push_back({name, {}, 0, at::tensor({int64_t(value.toBool())}, at::kLong), "bool"});
      }
    }
  }
  return out;
}

void loadHeldState(const HeldState& held, torch::optim::Optimizer& optimizer, const StateReader& reader) {
  at::NoGradGuard noGrad;
  const auto need = [&](const std::string& name) {
    if (!reader.has(name)) {
      fail<std::runtime_error>("the checkpoint has no {} (a checkpoint of another model or optimizer?)", name);
    }
  };
  for (const HeldTensor& h : held.model) {
    need("model/" + h.name);
    if (h.data.numel() == 0) continue;
    h.data.copy_(reader.read("model/" + h.name, h.offset, h.data.numel()));
  }

  const auto tensors = optimizerTensors(held, optimizer);
  // The parameters whose state was saved: "optimizer/<name>/..." exists.
  std::vector<bool> saved(tensors.size());
  bool missing = false;
  for (size_t i = 0; i < tensors.size(); ++i) {
    saved[i] = !reader.entries("optimizer/" + tensors[i].second->name + "/").empty();
    if (saved[i] && optimizer.state().count(stateKey(tensors[i].first)) == 0) missing = true;
  }
  if (missing) {
    // The optimizer makes its own state, of its own type, on a step: one on
    // zero gradients of exactly those tensors, whose change to them (weight
    // decay) is then undone.
    std::vector<at::Tensor> grads, values;
    for (size_t i = 0; i < tensors.size(); ++i) {
      at::Tensor p = tensors[i].first;
      grads.push_back(p.grad());
      const bool make = saved[i] && optimizer.state().count(stateKey(p)) == 0;
      values.push_back(make ? p.detach().clone() : at::Tensor());
      p.mutable_grad() = make ? at::zeros_like(p) : at::Tensor();
    }
    optimizer.step();
    for (size_t i = 0; i < tensors.size(); ++i) {
      at::Tensor p = tensors[i].first;
      if (values[i].defined()) p.detach().copy_(values[i]);
      p.mutable_grad() = grads[i];
    }
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!saved[i]) continue;
    const auto& [p, h] = tensors[i];
    auto it = optimizer.state().find(stateKey(p));
    DDP_CHECK(it != optimizer.state().end(), "held state: the optimizer made no state on a step");
    StateEntries entries = stateEntries(*it->second);
    for (auto& [key, value] : entries) {
      const std::string name = "optimizer/" + h->name + "/" + key;
      need(name);
      if (value.isTensor()) {
        const at::Tensor t = value.toTensor();
        const bool ranged = t.numel() == h->data.numel() && t.numel() > 0;
        at::Tensor read = reader.read(name, ranged ? h->offset : 0, t.numel());
        value = read.to(t.dtype()).view(t.sizes()).clone();
      } else if (value.isInt()) {
        value = reader.read(name, 0, 1).to(at::kLong).item<int64_t>();
      } else if (value.isDouble()) {
        value = reader.read(name, 0, 1).to(at::kDouble).item<double>();
      } else if (value.isBool()) {
        value = reader.read(name, 0, 1).to(at::kLong).item<int64_t>() != 0;
      }
    }
    it->second = stateFrom(*it->second, entries);
  }
}

}  // namespace ddp
