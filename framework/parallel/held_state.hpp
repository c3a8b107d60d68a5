// Held state: what one rank holds of the training state, the model and the
// optimizer, as flat ranges of named logical tensors. It is what a sharded
// checkpoint (framework/checkpoint) writes and reads: each rank writes its
// share of what it holds, in parallel, and on load each rank reads only the
// ranges it holds, whatever world size or strategy wrote them.
//
// Contract
// - A logical tensor is named "model/<name>" (a parameter or buffer, by its
//   name in named_parameters()/named_buffers()) or "optimizer/<parameter
//   name>/<entry>" (one value of that parameter's optimizer state, as
//   optimizer_state.hpp lists them: Adam's "exp_avg", "step", ...). Its
//   shape is the whole tensor's, whatever a rank holds of it.
// - A HeldTensor is a contiguous range [offset, offset + numel) of the
//   flattened logical tensor, and `data` a 1-D view of the rank's memory
//   that holds it (a ZeRO/FSDP piece, or the whole parameter): a load
//   writes into it in place. `replicas` ranks hold the same range (every
//   rank under ddp, a column of the rank mesh under hsdp) and this one is
//   number `replica` of them: on save each writes only its 1/replicas part,
//   so no byte is written twice.
// - HeldState::optimizer lists, in the order of the optimizer's param
//   groups, per tensor in the optimizer's param groups
//   (a piece or a whole parameter), the logical parameter range it stands
//   for; its state entries shaped like it are ranges of the same extent,
//   other entries (Adam's step) are whole values, written once by the
//   holder of the range's start with replica 0.
// - savedSlices() is this rank's share to write: the live tensors
//   themselves (host tensors; device ones are copied to the host), so a
//   writer finishes before training goes on or copies them into buffers of
//   its own (the asynchronous save does). loadHeldState() fills what the rank holds:
//   model ranges in place, and the optimizer's state, created first where
//   the optimizer has none yet (one step on zero gradients whose effect on
//   the parameters is undone), entry by entry; a logical tensor the reader
//   lacks is a std::runtime_error naming it.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

namespace ddp {

struct HeldTensor {
  std::string name;            // the logical tensor's name, without "model/"
  std::vector<int64_t> shape;  // the whole tensor's
  int64_t offset = 0;          // first element held, in the flattened tensor
  at::Tensor data;             // 1-D, numel elements, the live memory
  int replicas = 1, replica = 0;
};

struct HeldState {
  std::vector<HeldTensor> model;
  std::vector<HeldTensor> optimizer;  // names are parameter names
};

// One range that this rank writes into a sharded checkpoint.
struct StateSlice {
  std::string name;            // the full logical name ("model/...", "optimizer/...")
  std::vector<int64_t> shape;  // the whole tensor's
  int64_t offset = 0;
  at::Tensor data;             // 1-D, a copy on the CPU
  std::string scalar;          // "int" or "double" for an optimizer value that is not a tensor, else ""
};

// Reads [offset, offset + numel) of the flattened logical tensor `name`.
struct StateReader {
  std::function<bool(const std::string& name)> has;
  std::function<std::vector<std::string>(const std::string& prefix)> entries;  // names starting with prefix
  std::function<at::Tensor(const std::string& name, int64_t offset, int64_t numel)> read;
};

// Parameter and buffer names by TensorImpl.
std::unordered_map<const void*, std::string> tensorNames(torch::nn::Module& model);

// Every parameter and buffer of the model, whole, held alike by `replicas`
// ranks.
std::vector<HeldTensor> wholeModel(torch::nn::Module& model, int replicas, int replica);
// The same, and every tensor of the
// optimizer's param groups, whole, held alike by `replicas` ranks (ddp, one
// rank): the default of ParallelStrategy::heldState().
HeldState wholeHeldState(torch::nn::Module& model, torch::optim::Optimizer& optimizer, int replicas, int replica);

std::vector<StateSlice> savedSlices(const HeldState& held, torch::optim::Optimizer& optimizer);
void loadHeldState(const HeldState& held, torch::optim::Optimizer& optimizer, const StateReader& reader);

}  // namespace ddp
