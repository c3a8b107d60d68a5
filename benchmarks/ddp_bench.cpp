// ddp-bench: benchmarks of the ddp framework, one subcommand each
// (see commands.hpp for how a subcommand plugs in).
#include <CLI/CLI.hpp>

#include <exception>
#include <string>
#include <vector>
#include <csignal>
#include <iostream>

#include "benchmarks/bench_util.hpp"
#include "benchmarks/commands.hpp"
#include "framework/launch/spawn.hpp"
#include "framework/core/malloc_tuning.hpp"

namespace {

int benchMain(int argc, char** argv);

// A worker started as a copy of ddp-bench (bench_util.hpp's setWorkerEntry).
int workerInCopy(const std::vector<std::string>& argv) { return ddp::callMain(benchMain, argv); }

}  // namespace

int main(int argc, char** argv) {
  ddp::bench::setWorkerEntry(workerInCopy);
  return benchMain(argc, argv);
}

namespace {

int benchMain(int argc, char** argv) {
  // As ddp-run does, so that our side is measured as users run it; the
  // Python references run with glibc's defaults, as PyTorch users do.
  ddp::tuneMallocForTensors();
  CLI::App app{"ddp-bench: benchmarks of the ddp framework"};
  app.require_subcommand(1);

  ddp::bench::registerCollectivesCommand(app);
  ddp::bench::registerWineCommand(app);
  ddp::bench::registerTrainStepCommand(app);
  ddp::bench::registerLmCommand(app);
  ddp::bench::registerStrategiesCommand(app);
  ddp::bench::registerRegressCommand(app);
  ddp::bench::registerFaultsCommand(app);

  int status = 0;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    status = app.exit(e);  // also the path of CLI::RuntimeError from a failed subcommand
  } catch (const std::exception& e) {
    std::cerr << "ddp-bench: error: " << e.what() << "\n";
    status = 1;
  }
  // A run stopped by SIGINT/SIGTERM/SIGHUP (caught while a simulated
  // cluster existed, then torn down) ends as that signal would have ended
  // it: exit status 128 + signal, seen by the shell or the scheduler.
  if (const int sig = ddp::bench::stopSignal()) {
    std::signal(sig, SIG_DFL);
    std::raise(sig);
  }
  return status;
}

}  // namespace
