#include "framework/parallel/optimizer_state.hpp"

#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <sstream>

namespace ddp {

namespace {

torch::serialize::InputArchive reopen(torch::serialize::OutputArchive& out) {
  std::stringstream bytes;
  out.save_to(bytes);
  torch::serialize::InputArchive in;
  in.load_from(bytes);
  return in;
}

}  // namespace

StateEntries stateEntries(const torch::optim::OptimizerParamState& state) {
  torch::serialize::OutputArchive out;
  state.serialize(out);
  torch::serialize::InputArchive in = reopen(out);
  StateEntries entries;
  for (const std::string& key : in.keys()) {
    c10::IValue value;
    if (in.try_read(key, value)) entries.emplace_back(key, std::move(value));
  }
  return entries;
}

std::unique_ptr<torch::optim::OptimizerParamState> stateFrom(const torch::optim::OptimizerParamState& templ,
                                                             const StateEntries& entries) {
  torch::serialize::OutputArchive out;
  for (const auto& [key, value] : entries) out.write(key, value);
  torch::serialize::InputArchive in = reopen(out);
  std::unique_ptr<torch::optim::OptimizerParamState> state = templ.clone();
  state->serialize(in);
  return state;
}

std::string stateKey(const at::Tensor& param) { return c10::guts::to_string(param.unsafeGetTensorImpl()); }

int64_t optimizerStateBytes(const torch::optim::Optimizer& optimizer) {
  int64_t bytes = 0;
  for (const auto& [key, state] : optimizer.state()) {
    for (const auto& [name, value] : stateEntries(*state)) {
      if (value.isTensor() && value.toTensor().defined()) bytes += value.toTensor().nbytes();
    }
  }
  return bytes;
}

}  // namespace ddp
