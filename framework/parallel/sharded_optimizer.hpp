// ShardedOptimizer: an optimizer that steps this rank's pieces of the
// trainable parameters instead of the parameters, for the strategies that
// shard optimizer state (zero1, zero2, fsdp).
//
// Contract
// - Given the optimizer as the trainer built it (param groups holding the
//   full parameters), the trainable parameters in the flat order of
//   `shards`, and for each the tensor that holds this rank's piece of it
//   (FlatShards::pieceOf; undefined where this rank owns none): each param
//   group's trainable parameters are swapped for their pieces (dropped
//   where none); parameters that do not train stay as they are. The
//   optimizer then updates the pieces in place; the strategy gathers them.
// - A resumed optimizer (its consolidated state loaded before the strategy
//   was built) keeps, of each tensor shaped like its parameter, this rank's
//   piece; other values (Adam's step) as they are. Any optimizer whose
//   state entries optimizer_state.hpp can read works (every built-in one
//   and any out-of-tree one that follows the optimizer contract).
// - save(): collective; every rank calls it. The pieces' state is
//   allgathered value kind by value kind (one full tensor of one kind held
//   at a time), and on rank 0 (archive non-null) the full parameters and
//   their state are swapped in while the model and optimizer are written,
//   so the checkpoint is what one process would write. The strategy makes
//   the model's parameters whole before calling it, or (fsdp) hands their
//   copies in `modelCopies` (saveModelAndOptimizer, strategy.hpp): the
//   archive is written out after the units are released again.
// - The optimizer, the parameters and the pieces must outlive this.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "framework/comm/process_group.hpp"
#include "framework/parallel/flat_shards.hpp"
#include "framework/parallel/held_state.hpp"

namespace ddp {

class ShardedOptimizer {
 public:
  ShardedOptimizer(torch::optim::Optimizer& optimizer, std::vector<at::Tensor> params,
                   std::vector<at::Tensor> pieces, const FlatShards& shards, ProcessGroup& group,
                   Milliseconds timeout, const char* who);
  ~ShardedOptimizer();
  ShardedOptimizer(const ShardedOptimizer&) = delete;
  ShardedOptimizer& operator=(const ShardedOptimizer&) = delete;

  void save(torch::serialize::OutputArchive* archive, torch::nn::Module& model,
            const std::unordered_map<const void*, at::Tensor>* modelCopies = nullptr);

  // HeldState::optimizer (held_state.hpp) for the optimizer's param groups
  // as this rank runs them: a piece of parameter i is the range of it that
  // this rank owns, held by `pieceReplicas` ranks (hsdp's column; 1 under
  // zero and fsdp); a tensor that is not sharded (a frozen parameter in the
  // groups) is whole, held by `wholeReplicas` ranks.
  std::vector<HeldTensor> heldTensors(torch::nn::Module& model, int pieceReplicas, int pieceReplica,
                                      int wholeReplicas, int wholeReplica) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp
