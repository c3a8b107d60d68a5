// Uses an installed ddp through its umbrella header only: one-rank
// collectives from the built-in backends over a HashStore, one
// DistributedDataParallel step compared with the same step without DDP, and
// the built-in plugins. Prints "ok: ..." per check; any failure exits 1.
#include <ddp/ddp.hpp>

#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <string>

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  std::cout << (ok ? "ok: " : "FAILED: ") << what << std::endl;
  if (!ok) ++failures;
}

// A backend of this build that can run here: gloo (CPU) when compiled in.
std::string usableBackend() {
  for (const std::string& name : ddp::builtinBackends().names()) {
    if (!ddp::builtinBackends().whyUnusable(name)) return name;
  }
  return "";
}

void checkAllreduce(ddp::ProcessGroup& group) {
  at::Tensor t = torch::arange(8, torch::kFloat32);
  const at::Tensor expected = t.clone();
  group.allreduce(t)->wait();
  check(t.equal(expected), group.backendName() + " allreduce(sum) on 1 rank keeps the tensor");
  ddp::AllreduceOptions max;
  max.op = ddp::ReduceOp::Max;
  group.allreduce(t, max)->wait();
  check(t.equal(expected), group.backendName() + " allreduce(max) on 1 rank keeps the tensor");
}

void checkDdpStep(const ddp::ProcessGroupPtr& group) {
  at::manual_seed(0);
  auto plain = std::make_shared<torch::nn::LinearImpl>(4, 3);
  auto wrapped = std::make_shared<torch::nn::LinearImpl>(4, 3);
  {
    torch::NoGradGuard noGrad;
    wrapped->weight.copy_(plain->weight);
    wrapped->bias.copy_(plain->bias);
  }
  const at::Tensor initialWeight = plain->weight.detach().clone();
  ddp::DistributedDataParallel ddpModel(wrapped, group);
  torch::optim::SGD plainOpt(plain->parameters(), 0.1);
  torch::optim::SGD ddpOpt(wrapped->parameters(), 0.1);
  const at::Tensor x = torch::randn({5, 4});
  const at::Tensor y = torch::randn({5, 3});

  plainOpt.zero_grad();
  at::mse_loss(plain->forward(x), y).backward();
  plainOpt.step();

  ddpOpt.zero_grad();
  at::mse_loss(wrapped->forward(x), y).backward();
  ddpModel.finishGradientSync();
  ddpOpt.step();

  check(wrapped->weight.allclose(plain->weight) && wrapped->bias.allclose(plain->bias),
        "one DDP step on 1 rank gives the plain step's parameters");
  check(!wrapped->weight.equal(initialWeight) && ddpModel.bucketCount() > 0,
        "the DDP step used buckets and changed the parameters");
}

}  // namespace

int main() {
  std::cout << "ddp " << DDP_VERSION << std::endl;
  const std::string backend = usableBackend();
  if (backend.empty()) {
    std::cout << "SKIPPED: no backend of this build can run here" << std::endl;
    return 0;
  }
  auto store = std::make_shared<ddp::HashStore>();
  ddp::ProcessGroupPtr group = ddp::builtinBackends().create(backend, store, 0, 1);
  checkAllreduce(*group);
  checkDdpStep(group);

  const auto models = ddp::builtinPlugins().names(ddp::PluginKind::Model);
  check(std::find(models.begin(), models.end(), "mlp") != models.end(), "builtinPlugins() has model 'mlp'");

  // initDistributed for a single rank (no master: an in-memory store).
  ddp::RankEnv env;
  env.rank = 0;
  env.worldSize = 1;
  ddp::DistributedOptions options;
  options.backend = backend;
  ddp::DistributedContext context = ddp::initDistributed(env, options, ddp::builtinBackends());
  checkAllreduce(*context.group);

  if (failures > 0) {
    std::cout << failures << " check(s) failed" << std::endl;
    return 1;
  }
  std::cout << "all checks passed" << std::endl;
  return 0;
}
