// Adam and AdamW with a fused update (adam.hpp).
//
// Why not torch::optim::Adam: it issues about a dozen tensor operations per
// parameter per step, each with dispatcher and allocation overhead. On small
// models (the wine MLP has 1,091 weights in 4 tensors) that overhead is most
// of a training step. Here each float32/float64 contiguous CPU parameter is
// updated in one pass over its raw data, with PyTorch's exact formulas; any
// other parameter takes the same formulas as tensor operations.
//
// The options and state types are LibTorch's own (AdamOptions,
// AdamParamState, ...), so get_lr()/set_lr() work through param_groups(), and
// save()/load() write the same archive layout as torch::optim::Adam; load()
// also restores the groups' options (see restoreGroupOptions).
#include "plugins/optimizers/adam.hpp"

#include <ATen/Parallel.h>

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <type_traits>
#include <utility>

#include "plugins/common.hpp"
#include "plugins/kernels/adam_kernel.hpp"
#include "plugins/optimizers/group_options.hpp"

namespace ddp::plugins {

namespace {

bool fusable(const at::Tensor& t, const at::Tensor& like) {
  return t.defined() && t.device().is_cpu() && t.layout() == at::kStrided && t.scalar_type() == like.scalar_type() &&
         t.is_contiguous() && t.numel() == like.numel();
}

// The key LibTorch's optimizers file a parameter's state under. LibTorch
// 1.x keys state_ by a string, the parameter's TensorImpl address as an
// std::ostream prints a pointer ("0x" and lowercase hex); LibTorch 2.x keys
// it by the TensorImpl pointer itself. The map's key_type tells which.
using StateKey = std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;

// 1.x: the string, spelled without the std::ostringstream that costs several
// microseconds per parameter per step. Fits std::string's small buffer: no
// allocation either.
[[maybe_unused]] std::string stateKeyAs(const c10::TensorImpl* impl, std::string* /*type*/) {
  char buf[2 + 2 * sizeof(uintptr_t)] = {'0', 'x'};
  const auto end = std::to_chars(buf + 2, buf + sizeof(buf), reinterpret_cast<uintptr_t>(impl), 16).ptr;
  return std::string(buf, end);
}
// 2.x: the pointer.
[[maybe_unused]] void* stateKeyAs(const c10::TensorImpl* impl, void** /*type*/) {
  return const_cast<c10::TensorImpl*>(impl);
}

StateKey stateKey(const c10::TensorImpl* impl) { return stateKeyAs(impl, static_cast<StateKey*>(nullptr)); }

// Whether stateKey(impl) is the key LibTorch's save()/load() use for impl.
[[maybe_unused]] bool isLibTorchStateKey(const c10::TensorImpl* impl, const std::string& key) {
  std::ostringstream spelled;
  spelled << static_cast<const void*>(impl);
  return key == spelled.str();
}
[[maybe_unused]] bool isLibTorchStateKey(const c10::TensorImpl* impl, void* key) { return key == impl; }

// PyTorch's formulas as tensor operations: for dtypes and devices the
// kernel does not handle.
void adamWithTensorOps(const AdamStep& s, at::Tensor& param, const at::Tensor& gradIn, at::Tensor& expAvg,
                       at::Tensor& expAvgSq, at::Tensor& maxExpAvgSq) {
  at::Tensor grad = gradIn;
  if (s.weightDecay != 0) {
    if (s.decoupled) {
      param.mul_(1 - s.lr * s.weightDecay);
    } else {
      grad = grad.add(param, s.weightDecay);
    }
  }
  expAvg.mul_(s.beta1).add_(grad, 1 - s.beta1);
  expAvgSq.mul_(s.beta2).addcmul_(grad, grad, 1 - s.beta2);
  at::Tensor denom;
  if (s.amsgrad) {
    at::maximum_out(maxExpAvgSq, maxExpAvgSq, expAvgSq);
    denom = (maxExpAvgSq.sqrt() / std::sqrt(s.biasCorrection2)).add_(s.eps);
  } else {
    denom = (expAvgSq.sqrt() / std::sqrt(s.biasCorrection2)).add_(s.eps);
  }
  param.addcdiv_(expAvg, denom, -(s.lr / s.biasCorrection1));
}

// Options: torch::optim::AdamOptions or AdamWOptions (same fields);
// State: the matching AdamParamState / AdamWParamState.
template <typename Options, typename State, bool Decoupled>
class FusedAdam : public torch::optim::Optimizer {
 public:
  FusedAdam(std::vector<at::Tensor> params, const Options& defaults)
      : Optimizer({torch::optim::OptimizerParamGroup(std::move(params))}, std::make_unique<Options>(defaults)) {
    // save()/load() find states by LibTorch's own key: stateKey must make it.
    for (const auto& p : param_groups_.front().params()) {
      TORCH_INTERNAL_ASSERT(isLibTorchStateKey(p.unsafeGetTensorImpl(), stateKey(p.unsafeGetTensorImpl())));
    }
  }

  at::Tensor step(LossClosure closure = nullptr) override {
    at::NoGradGuard noGrad;
    at::Tensor loss;
    if (closure) {
      at::AutoGradMode enableGrad(true);
      loss = closure();
    }
    for (auto& group : param_groups_) {
      const auto& options = static_cast<const Options&>(group.options());
      for (auto& param : group.params()) {
        if (!param.grad().defined()) continue;
        stepOne(options, param);
      }
    }
    return loss;
  }

  void save(torch::serialize::OutputArchive& archive) const override {
    torch::optim::serialize<State, Options>(archive, *this);
  }

  void load(torch::serialize::InputArchive& archive) override {
    torch::optim::serialize<State, Options>(archive, *this);
    restoreGroupOptions<Options>(archive, *this);
  }

 private:
  void stepOne(const Options& options, at::Tensor& param) {
    const at::Tensor& grad = param.grad();
    TORCH_CHECK(!grad.is_sparse(), Decoupled ? "adamw" : "adam", " does not support sparse gradients");
    const StateKey key = stateKey(param.unsafeGetTensorImpl());
    auto found = state_.find(key);
    if (found == state_.end()) {
      auto fresh = std::make_unique<State>();
      fresh->step(0);
      fresh->exp_avg(torch::zeros_like(param, at::MemoryFormat::Preserve));
      fresh->exp_avg_sq(torch::zeros_like(param, at::MemoryFormat::Preserve));
      if (options.amsgrad()) fresh->max_exp_avg_sq(torch::zeros_like(param, at::MemoryFormat::Preserve));
      found = state_.emplace(key, std::move(fresh)).first;
    }
    auto& state = static_cast<State&>(*found->second);
    state.step(state.step() + 1);

    AdamStep s;
    s.lr = options.lr();
    s.beta1 = std::get<0>(options.betas());
    s.beta2 = std::get<1>(options.betas());
    s.eps = options.eps();
    s.weightDecay = options.weight_decay();
    s.decoupled = Decoupled;
    s.amsgrad = options.amsgrad();
    s.biasCorrection1 = 1 - std::pow(s.beta1, static_cast<double>(state.step()));
    s.biasCorrection2 = 1 - std::pow(s.beta2, static_cast<double>(state.step()));

    at::Tensor& expAvg = state.exp_avg();
    at::Tensor& expAvgSq = state.exp_avg_sq();
    if (s.amsgrad && !state.max_exp_avg_sq().defined()) {
      state.max_exp_avg_sq(torch::zeros_like(param, at::MemoryFormat::Preserve));
    }
    at::Tensor maxExpAvgSq = s.amsgrad ? state.max_exp_avg_sq() : at::Tensor();

    const bool fast = (param.scalar_type() == at::kFloat || param.scalar_type() == at::kDouble) &&
                      fusable(param, param) && fusable(grad, param) && fusable(expAvg, param) &&
                      fusable(expAvgSq, param) && (!s.amsgrad || fusable(maxExpAvgSq, param));
    if (!fast) {
      adamWithTensorOps(s, param, grad, expAvg, expAvgSq, maxExpAvgSq);
      return;
    }
    AT_DISPATCH_FLOATING_TYPES(param.scalar_type(), "ddp_fused_adam", [&] {
      scalar_t* p = param.data_ptr<scalar_t>();
      const scalar_t* g = grad.data_ptr<scalar_t>();
      scalar_t* m = expAvg.data_ptr<scalar_t>();
      scalar_t* v = expAvgSq.data_ptr<scalar_t>();
      scalar_t* vMax = s.amsgrad ? maxExpAvgSq.data_ptr<scalar_t>() : nullptr;
      // Small tensors stay on this thread: forking costs more than the work.
      at::parallel_for(0, param.numel(), 1 << 15,
                       [&](int64_t begin, int64_t end) { adamKernel<scalar_t>(s, p, g, m, v, vMax, begin, end); });
    });
    // Writes through data_ptr() bypass the version counter that in-place
    // tensor ops bump; bump it so autograd still catches a graph that saved
    // the old values.
    param.unsafeGetTensorImpl()->bump_version();
    expAvg.unsafeGetTensorImpl()->bump_version();
    expAvgSq.unsafeGetTensorImpl()->bump_version();
  }
};

using Adam = FusedAdam<torch::optim::AdamOptions, torch::optim::AdamParamState, false>;
using AdamW = FusedAdam<torch::optim::AdamWOptions, torch::optim::AdamWParamState, true>;

// beta1, beta2, eps, weight_decay: shared by adam and adamw.
template <typename Options>
Options adamOptions(const Params& params) {
  const double beta1 = params.getDouble("beta1");
  const double beta2 = params.getDouble("beta2");
  requireBelow(kOptimizer, "beta1", beta1, 1.0);
  requireBelow(kOptimizer, "beta2", beta2, 1.0);
  Options options(params.getDouble("lr"));
  options.betas(std::make_tuple(beta1, beta2));
  options.eps(params.getDouble("eps"));
  options.weight_decay(params.getDouble("weight_decay"));
  return options;
}

}  // namespace

std::unique_ptr<torch::optim::Optimizer> makeAdam(std::vector<at::Tensor> parameters, const Params& params) {
  return std::make_unique<Adam>(std::move(parameters), adamOptions<torch::optim::AdamOptions>(params));
}

std::unique_ptr<torch::optim::Optimizer> makeAdamW(std::vector<at::Tensor> parameters, const Params& params) {
  return std::make_unique<AdamW>(std::move(parameters), adamOptions<torch::optim::AdamWOptions>(params));
}

}  // namespace ddp::plugins
