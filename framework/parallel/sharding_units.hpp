// ShardingUnits: how a model tells a strategy that shards its parameters
// (fsdp) which parts of it run one after the other, so that only the part
// running needs its full parameters.
//
// LibTorch modules have no forward pre-hooks, so the model does what they
// would: it names its units and runs each through runUnit().
//
// Contract, for a model
// - shardingUnits(): sub-modules in the order forward runs them (a GPT's
//   blocks, an MLP's layers). A parameter belongs to the first unit that
//   holds it; one held by two units (tied weights) and one outside every
//   unit belong to the model itself, which the strategy keeps whole. The
//   default, no units, keeps everything whole.
// - forward() runs unit i as runUnit(i, [&] { return unit->forward(x); }):
//   the lambda runs every use of unit i's parameters in this forward, and
//   returns the tensor that the rest of the model uses (computed, not a
//   view of the unit's parameters). A unit may run more than once per
//   forward; it is gathered each time. Nothing outside the lambda may touch
//   the unit's parameters, and nothing computed from them may reach
//   backward except through the returned tensor.
//
// Contract, for a strategy
// - setUnitHooks(hooks) while it owns the model, setUnitHooks(nullptr) when
//   it lets go. Without hooks runUnit() just runs the lambda.
// - hooks->beforeForward(i) runs before the lambda (gather the unit),
//   hooks->afterForward(i, output) after it, and what it returns is what
//   runUnit returns (it may attach an autograd hook to it, to gather the
//   unit again before backward reaches it).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <memory>
#include <utility>
#include <vector>

namespace ddp {

class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  virtual void beforeForward(size_t unit) = 0;
  virtual at::Tensor afterForward(size_t unit, at::Tensor output) = 0;
};

class ShardingUnits {
 public:
  virtual ~ShardingUnits() = default;
  virtual std::vector<std::shared_ptr<torch::nn::Module>> shardingUnits() { return {}; }
  void setUnitHooks(UnitHooks* hooks) { unitHooks_ = hooks; }

 protected:
  template <typename Forward>
  at::Tensor runUnit(size_t unit, Forward&& forward) {
    if (!unitHooks_) return std::forward<Forward>(forward)();
    unitHooks_->beforeForward(unit);
    return unitHooks_->afterForward(unit, std::forward<Forward>(forward)());
  }

 private:
  UnitHooks* unitHooks_ = nullptr;
};

}  // namespace ddp
