// ddp-run: starts a job. As a launcher (--nproc-per-node N) it spawns this
// node's ranks; as a rank (started by ddp-run, torchrun, srun or mpirun) it
// joins the group and runs the job.
#include <ATen/ATen.h>
#include <CLI/CLI.hpp>

#include <iostream>

#include "framework/distributed.hpp"
#include "framework/errors.hpp"
#include "framework/launcher.hpp"
#include "framework/rank_env.hpp"

namespace {

struct Args {
  int nprocPerNode = 0;
  int nnodes = 1;
  int nodeRank = 0;
  std::string masterAddr = "127.0.0.1";
  int masterPort = 0;
  int maxRestarts = 0;
  std::string backend = "gloo";
  bool demo = false;
};

// The collective demo: allreduce, broadcast and allgather with checked results.
int runDemo(const ddp::RankEnv& env, const Args& args) {
  ddp::DistributedOptions dopts;
  dopts.backend = args.backend;
  dopts.timeout = std::chrono::milliseconds(60000);
  auto ctx = ddp::initDistributed(env, dopts);
  auto& pg = *ctx.group;
  const int n = pg.size(), r = pg.rank();
  at::Tensor t = at::full({1 << 20}, float(r + 1));
  auto start = std::chrono::steady_clock::now();
  pg.allreduce(t)->wait();
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  const float expected = n * (n + 1) / 2.0f;
  bool ok = at::all(t == expected).item<bool>();
  at::Tensor b = at::full({4}, float(r));
  pg.broadcast(b, {0})->wait();
  ok = ok && at::all(b == 0.0f).item<bool>();
  at::Tensor g = at::empty({n});
  pg.allgather(at::full({1}, float(r)), g)->wait();
  ok = ok && at::equal(g, at::arange(n).to(at::kFloat));
  pg.barrier()->wait();
  std::cout << "rank " << r << "/" << n << " (" << pg.backendName() << ", from " << env.source
            << "): allreduce of 4 MiB = " << t[0].item<float>() << " (expected " << expected << ") in " << ms
            << " ms; broadcast and allgather " << (ok ? "correct" : "WRONG") << std::endl;
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ddp-run: run a data-parallel job on one process, every core of a machine, or a cluster"};
  Args args;
  app.add_option("--nproc-per-node", args.nprocPerNode, "ranks to start on this node (launcher mode)");
  app.add_option("--nnodes", args.nnodes, "number of nodes in the job");
  app.add_option("--node-rank", args.nodeRank, "this node's index, 0 on the master");
  app.add_option("--master-addr", args.masterAddr, "address of the node with --node-rank 0");
  app.add_option("--master-port", args.masterPort, "port of the rendezvous store (0: pick a free one)");
  app.add_option("--max-restarts", args.maxRestarts, "restart all ranks up to this many times after a failure");
  app.add_option("--backend", args.backend, "communication backend (gloo, nccl)");
  app.add_flag("--demo", args.demo, "run the collective demo instead of an experiment");
  CLI11_PARSE(app, argc, argv);

  try {
    const auto env = ddp::rankEnvFromEnvironment(ddp::currentEnvironment());
    if (args.nprocPerNode > 0 && !(env && env->source == "ddp-run")) {
      ddp::LaunchOptions lo;
      lo.nprocPerNode = args.nprocPerNode;
      lo.nnodes = args.nnodes;
      lo.nodeRank = args.nodeRank;
      lo.masterAddr = args.masterAddr;
      lo.masterPort = args.masterPort;
      lo.maxRestarts = args.maxRestarts;
      lo.backend = args.backend;
      lo.workerArgv = {"/proc/self/exe"};
      for (int i = 1; i < argc; ++i) lo.workerArgv.push_back(argv[i]);
      return ddp::launchLocalRanks(lo);
    }
    ddp::RankEnv me = env.value_or(ddp::RankEnv{});
    if (!args.demo) {
      std::cerr << "ddp-run: no experiment given. HINT: ddp-run --nproc-per-node 2 --demo" << std::endl;
      return 2;
    }
    return runDemo(me, args);
  } catch (const ddp::UsageError& e) {
    std::cerr << e.what() << std::endl;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "ddp-run: " << e.what() << std::endl;
    return 1;
  }
}
