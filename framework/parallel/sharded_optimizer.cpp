#include "framework/parallel/sharded_optimizer.hpp"


#include <map>
#include <set>
#include <string>
#include <unordered_map>

#include "framework/core/errors.hpp"
#include "framework/parallel/model_sync.hpp"
#include "framework/parallel/optimizer_state.hpp"
#include "framework/parallel/strategy.hpp"

namespace ddp {

namespace {
using torch::optim::OptimizerParamState;
using StateMap = std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>;
}  // namespace

struct ShardedOptimizer::Impl {
  torch::optim::Optimizer& optimizer;
  std::vector<at::Tensor> params, pieces;
  FlatShards shards;
  ProcessGroup& group;
  Milliseconds timeout;
  const char* who;
  int rank = 0, world = 1;
  at::TensorOptions options;  // the parameters' dtype, for gathered state
  std::vector<std::optional<FlatShards::Piece>> pieceInfo;
  // The optimizer's param groups as given (full parameters), and as this
  // rank runs them (pieces).
  std::vector<std::vector<at::Tensor>> fullGroups, pieceGroups;

  Impl(torch::optim::Optimizer& o, std::vector<at::Tensor> p, std::vector<at::Tensor> pc, const FlatShards& s,
       ProcessGroup& g, Milliseconds t, const char* w)
      : optimizer(o), params(std::move(p)), pieces(std::move(pc)), shards(s), group(g), timeout(t), who(w) {}
  void slicePieceStates();
  // Full states of the trainable parameters, on rank 0 (null elsewhere).
  std::unique_ptr<StateMap> gatherFullStates();
};

ShardedOptimizer::ShardedOptimizer(torch::optim::Optimizer& optimizer, std::vector<at::Tensor> params,
                                   std::vector<at::Tensor> pieces, const FlatShards& shards, ProcessGroup& group,
                                   Milliseconds timeout, const char* who)
    : impl_(std::make_unique<Impl>(optimizer, std::move(params), std::move(pieces), shards, group, timeout, who)) {
  Impl& s = *impl_;
  DDP_CHECK(s.params.size() == s.pieces.size() && s.params.size() == shards.paramCount(),
            "ShardedOptimizer: one piece per parameter");
  s.rank = group.rank();
  s.world = group.size();
  s.options = s.params.empty() ? at::TensorOptions(at::kFloat) : s.params.front().options().requires_grad(false);
  std::unordered_map<const void*, size_t> indexOf;
  for (size_t i = 0; i < s.params.size(); ++i) {
    indexOf[s.params[i].unsafeGetTensorImpl()] = i;
    s.pieceInfo.push_back(shards.pieceOf(i, s.rank));
  }
  // Trainable parameters are swapped for this rank's pieces (or dropped
  // where it owns none); others stay.
  for (auto& g : optimizer.param_groups()) {
    s.fullGroups.push_back(g.params());
    std::vector<at::Tensor> mine;
    for (const at::Tensor& p : g.params()) {
      auto it = indexOf.find(p.unsafeGetTensorImpl());
      if (it == indexOf.end()) {
        mine.push_back(p);
      } else if (s.pieces[it->second].defined()) {
        mine.push_back(s.pieces[it->second]);
      }
    }
    s.pieceGroups.push_back(mine);
  }
  s.slicePieceStates();
  for (size_t g = 0; g < s.pieceGroups.size(); ++g) optimizer.param_groups()[g].params() = s.pieceGroups[g];
}

ShardedOptimizer::~ShardedOptimizer() = default;

// A resumed optimizer holds the full parameters' state: keep this rank's
// part of every tensor shaped like its parameter.
void ShardedOptimizer::Impl::slicePieceStates() {
  StateMap& state = optimizer.state();
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

// The pieces' optimizer state, gathered into each trainable parameter's
// full state on rank 0 (null elsewhere). Each parameter's state is decided
// by the rank that owns its first element: whether it has state, which
// per-element values (tensors shaped like the piece, gathered in their own
// dtype) and which scalar values (ints and doubles, such as Adam's step)
// it holds. Other values come from a state on rank 0 of the same
// optimizer, which is also the type a parameter's state is rebuilt as.
std::unique_ptr<StateMap> ShardedOptimizer::Impl::gatherFullStates() {
  const size_t P = params.size();
  std::vector<StateEntries> mine(P);
  std::vector<bool> hasState(P, false);
  for (size_t i = 0; i < P; ++i) {
    if (!pieces[i].defined()) continue;
    auto it = optimizer.state().find(stateKey(pieces[i]));
    if (it == optimizer.state().end()) continue;
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
  for (const std::string& text : allgatherStrings(group, list, timeout)) {
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
  if (world > 1 && table.numel() > 0) group.allreduce(table, {ReduceOp::Sum, timeout})->wait();

  // Per-element values: each rank's pieces in its shard, gathered.
  const int64_t S = shards.shardSize();
  std::map<std::string, at::Tensor> gathered;
  for (const std::string& col : columns) {
    if (col[0] != 't') continue;
    const auto dtype = static_cast<at::ScalarType>(std::stoi(col.substr(1, col.find(' ') - 1)));
    const std::string key = col.substr(col.find(' ') + 1);
    at::Tensor shard = at::zeros({S}, options.dtype(dtype));
    for (size_t i = 0; i < P; ++i) {
      for (const auto& [k, value] : mine[i]) {
        if (k == key && value.isTensor() && value.toTensor().scalar_type() == dtype &&
            value.toTensor().numel() == pieceInfo[i]->length)
          shard.narrow(0, pieceInfo[i]->shardOffset, pieceInfo[i]->length).copy_(value.toTensor());
      }
    }
    at::Tensor whole = at::empty({S * world}, shard.options());
    group.allgather(shard, whole, {timeout})->wait();
    if (rank == 0) gathered[col] = whole;
  }
  if (rank != 0) return nullptr;

  auto states = std::make_unique<StateMap>();
  bool anyState = false;
  for (size_t i = 0; i < P; ++i) anyState = anyState || cell[i][0] > 0;
  if (!anyState) return states;  // no step taken yet
  // A state of this optimizer on rank 0, for its type and other values.
  const OptimizerParamState* templ = nullptr;
  for (const auto& [key, state] : optimizer.state()) {
    templ = state.get();
    break;
  }
  if (!templ) {
    fail<UsageError>("{}: rank 0 holds no optimizer state while other ranks do (only some parameters are "
                     "trained?), so it cannot write the checkpoint's optimizer. HINT: train every parameter the "
                     "optimizer holds, or use distributed.strategy=ddp",
                     who);
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
          if (auto piece = shards.pieceOf(i, r))
            parts.push_back(gathered[col].narrow(0, r * S + piece->shardOffset, piece->length));
        }
        entries.emplace_back(key, at::cat(parts).view(params[i].sizes()).clone());
      }
    }
    (*states)[stateKey(params[i])] = stateFrom(*templ, entries);
  }
  return states;
}

std::vector<HeldTensor> ShardedOptimizer::heldTensors(torch::nn::Module& model, int pieceReplicas, int pieceReplica,
                                                      int wholeReplicas, int wholeReplica) const {
  const Impl& s = *impl_;
  const auto names = tensorNames(model);
  std::unordered_map<const void*, size_t> pieceOf;
  for (size_t i = 0; i < s.pieces.size(); ++i)
    if (s.pieces[i].defined()) pieceOf[s.pieces[i].unsafeGetTensorImpl()] = i;
  std::vector<HeldTensor> out;
  for (const auto& group : s.optimizer.param_groups()) {
    for (const at::Tensor& p : group.params()) {
      auto piece = pieceOf.find(p.unsafeGetTensorImpl());
      if (piece != pieceOf.end()) {
        const size_t i = piece->second;
        auto name = names.find(s.params[i].unsafeGetTensorImpl());
        DDP_CHECK(name != names.end(), "ShardedOptimizer: a sharded parameter is not the model's");
        out.push_back({name->second, s.params[i].sizes().vec(), s.pieceInfo[i]->paramOffset, p.detach().view({-1}),
                       pieceReplicas, pieceReplica});
        continue;
      }
      auto name = names.find(p.unsafeGetTensorImpl());
      DDP_CHECK(name != names.end(), "ShardedOptimizer: the optimizer steps a tensor that is not the model's");
      out.push_back({name->second, p.sizes().vec(), 0, p.detach().contiguous().view({-1}), wholeReplicas, wholeReplica});
    }
  }
  return out;
}

void ShardedOptimizer::save(torch::serialize::OutputArchive* archive, torch::nn::Module& model,
                            const std::unordered_map<const void*, at::Tensor>* modelCopies) {
  Impl& s = *impl_;
  std::unique_ptr<StateMap> full = s.gatherFullStates();
  if (!archive) return;
  // Write as one process holding the full parameters would: swap the full
  // parameters and their state in, save, swap the pieces back.
  auto& groups = s.optimizer.param_groups();
  StateMap pieceStates = std::move(s.optimizer.state());
  // Parameters the optimizer holds that are not sharded (they do not
  // require grad) keep their own state.
  std::set<std::string> pieceKeys;
  for (const auto& piece : s.pieces)
    if (piece.defined()) pieceKeys.insert(stateKey(piece));
  for (const auto& [key, state] : pieceStates)
    if (!pieceKeys.count(key)) (*full)[key] = state->clone();
  s.optimizer.state() = std::move(*full);
  for (size_t g = 0; g < groups.size(); ++g) groups[g].params() = s.fullGroups[g];
  auto restore = [&] {
    for (size_t g = 0; g < groups.size(); ++g) groups[g].params() = s.pieceGroups[g];
    s.optimizer.state() = std::move(pieceStates);
  };
  try {
    saveModelAndOptimizer(*archive, model, s.optimizer, modelCopies);
  } catch (...) {
    restore();
    throw;
  }
  restore();
}

}  // namespace ddp
