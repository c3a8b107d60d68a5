// Learning-rate schedulers, as closed forms of the epoch: the trainer sets
// the lr at each epoch start, so resuming at epoch k needs no replay.
#include <algorithm>
#include <cmath>

#include "plugins/common.hpp"

namespace ddp::plugins {

namespace {

// lr = base * gamma^floor(epoch / step_size), as torch.optim.lr_scheduler.StepLR.
class StepScheduler : public LrScheduler {
 public:
  StepScheduler(int64_t stepSize, double gamma) : stepSize_(stepSize), gamma_(gamma) {}
  double lrAt(int64_t epoch, double baseLr) const override {
    const int64_t decays = std::max<int64_t>(epoch, 0) / stepSize_;
    return baseLr * std::pow(gamma_, static_cast<double>(decays));
  }

 private:
  int64_t stepSize_;
  double gamma_;
};

// Half a cosine from base down to eta_min over t_max epochs, as
// CosineAnnealingLR's closed form; unlike it, the lr then stays at eta_min
// instead of climbing back, since running past t_max is rarely meant as a
// restart.
class CosineScheduler : public LrScheduler {
 public:
  CosineScheduler(int64_t tMax, double etaMin) : tMax_(tMax), etaMin_(etaMin) {}
  double lrAt(int64_t epoch, double baseLr) const override {
    const double t = static_cast<double>(std::clamp<int64_t>(epoch, 0, tMax_));
    return etaMin_ + (baseLr - etaMin_) * (1 + std::cos(M_PI * t / static_cast<double>(tMax_))) / 2;
  }

 private:
  int64_t tMax_;
  double etaMin_;
};

// The base lr throughout: a schedule of warm-up only.
class ConstantScheduler : public LrScheduler {
 public:
  double lrAt(int64_t /*epoch*/, double baseLr) const override { return baseLr; }
};

}  // namespace

void registerSchedulers(PluginRegistry& registry) {
  registry.add({"constant",
                "the optimizer's lr throughout (with warmup_steps: a linear warm-up to it)",
                {},
                [](const Params&) -> std::unique_ptr<LrScheduler> { return std::make_unique<ConstantScheduler>(); }});
  registry.add({"step",
                "multiply the lr by gamma every step_size epochs",
                {
                    Param("step_size", ParamType::Int, 30, "epochs between decays").atLeast(1),
                    Param("gamma", ParamType::Float, 0.1, "decay factor").above(0).atMost(1),
                },
                [](const Params& params) -> std::unique_ptr<LrScheduler> {
                  return std::make_unique<StepScheduler>(params.getInt("step_size"), params.getDouble("gamma"));
                }});
  registry.add({"cosine",
                "cosine annealing from the base lr to eta_min over t_max epochs, then eta_min",
                {
                    Param("t_max", ParamType::Int, 100, "epochs to reach eta_min").atLeast(1),
                    Param("eta_min", ParamType::Float, 0.0, "final lr").atLeast(0),
                },
                [](const Params& params) -> std::unique_ptr<LrScheduler> {
                  return std::make_unique<CosineScheduler>(params.getInt("t_max"), params.getDouble("eta_min"));
                }});
}

}  // namespace ddp::plugins
