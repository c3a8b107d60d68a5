// The subcommands of ddp-bench. Each lives in its own bench_<name>.cpp and
// adds itself to the application through one register function; main()
// (ddp_bench.cpp) calls them all.
//
// A subcommand does its work in its CLI11 callback. To fail, it prints its
// message to stderr and throws CLI::RuntimeError(exitCode), which main()
// turns into the process's exit status without printing anything more.
#pragma once

namespace CLI {
class App;
}

namespace ddp::bench {

// `ddp-bench collectives`: bandwidth of allreduce/allgather/broadcast/
// reduce_scatter for each CPU backend against LibTorch's c10d Gloo (where
// this build has it: see benchmarks/CMakeLists.txt).
void registerCollectivesCommand(CLI::App& app);

// `ddp-bench wine`: wall time of the 100-epoch wine baseline in-process vs
// the same loop in PyTorch (Python).
void registerWineCommand(CLI::App& app);

// `ddp-bench train-step`: per-step time and scaling of an MLP training step
// under DistributedDataParallel vs PyTorch DDP.
void registerTrainStepCommand(CLI::App& app);

// `ddp-bench lm`: validation loss of a language model experiment trained by
// ddp-run against the same training in PyTorch (Python).
void registerLmCommand(CLI::App& app);

// `ddp-bench strategies`: step time and memory of ddp, zero1, ... on a 50M
// parameter MLP against PyTorch's DDP, ZeroRedundancyOptimizer and FSDP.
void registerStrategiesCommand(CLI::App& app);

// `ddp-bench regress`: train-step ratios of mlp, cnn and gpt against the
// baseline recorded in benchmarks/baselines/train_step.json.
void registerRegressCommand(CLI::App& app);

// `ddp-bench faults`: hosts killed and links cut on a simulated cluster
// under a job that recovers in place, its store on etcd; the time to the
// next step, steps lost, final world and accuracy, per fault.
void registerFaultsCommand(CLI::App& app);

}  // namespace ddp::bench
