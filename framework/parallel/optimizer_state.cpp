#include "framework/parallel/optimizer_state.hpp"

#include <torch/optim.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <optional>
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

namespace {

int64_t bytesOf(std::initializer_list<at::Tensor> tensors) {
  int64_t bytes = 0;
  for (const at::Tensor& t : tensors)
    if (t.defined()) bytes += static_cast<int64_t>(t.nbytes());
  return bytes;
}

// LibTorch's own states, read directly: serializing a large state only to
// measure it would copy all of it.
std::optional<int64_t> knownStateBytes(const torch::optim::OptimizerParamState& state) {
  using namespace torch::optim;
  if (auto* s = dynamic_cast<const AdamParamState*>(&state))
    return bytesOf({s->exp_avg(), s->exp_avg_sq(), s->max_exp_avg_sq()});
  if (auto* s = dynamic_cast<const AdamWParamState*>(&state))
    return bytesOf({s->exp_avg(), s->exp_avg_sq(), s->max_exp_avg_sq()});
  if (auto* s = dynamic_cast<const SGDParamState*>(&state)) return bytesOf({s->momentum_buffer()});
  if (auto* s = dynamic_cast<const AdagradParamState*>(&state)) return bytesOf({s->sum()});
  if (auto* s = dynamic_cast<const RMSpropParamState*>(&state))
    return bytesOf({s->square_avg(), s->momentum_buffer(), s->grad_avg()});
  return std::nullopt;
}

}  // namespace

int64_t optimizerStateBytes(const torch::optim::Optimizer& optimizer) {
  int64_t bytes = 0;
  for (const auto& [key, state] : optimizer.state()) {
    if (auto known = knownStateBytes(*state)) {
      bytes += *known;
      continue;
    }
    for (const auto& [name, value] : stateEntries(*state)) {
      if (value.isTensor() && value.toTensor().defined()) bytes += static_cast<int64_t>(value.toTensor().nbytes());
    }
  }
  return bytes;
}

}  // namespace ddp
