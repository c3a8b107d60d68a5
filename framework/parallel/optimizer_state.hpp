// One parameter's optimizer state as named values, whatever the optimizer:
// what its OptimizerParamState::serialize() writes (Adam: "step",
// "exp_avg", "exp_avg_sq", ...; SGD: "momentum_buffer"). Sharded strategies
// use it to cut a full parameter's state into pieces and to put pieces
// back together, without knowing the optimizer; an out-of-tree optimizer
// works as long as its state serializes its tensors.
//
// Contract
// - stateEntries() lists every value serialize() writes, in its order
//   (undefined tensors are not written, so they do not appear).
// - stateFrom() returns a new state of the template's type (clone()) into
//   which the entries were read with serialize(InputArchive&); entries the
//   state does not read are ignored, values it reads and are absent keep
//   the template's.
// - Slow (each call goes through a serialized archive): for start-up and
//   checkpoints, not for every step.
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/optim/optimizer.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ddp {

using StateEntries = std::vector<std::pair<std::string, c10::IValue>>;

StateEntries stateEntries(const torch::optim::OptimizerParamState& state);
std::unique_ptr<torch::optim::OptimizerParamState> stateFrom(const torch::optim::OptimizerParamState& templ,
                                                             const StateEntries& entries);

// The key LibTorch's optimizers file a parameter's state under.
std::string stateKey(const at::Tensor& param);

// Bytes of every tensor in the optimizer's state (summed over the state
// it holds, i.e. this rank's).
int64_t optimizerStateBytes(const torch::optim::Optimizer& optimizer);

}  // namespace ddp
