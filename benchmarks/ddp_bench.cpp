// ddp-bench: benchmarks of the ddp framework, one subcommand each
// (see commands.hpp for how a subcommand plugs in).
#include <CLI/CLI.hpp>

#include <exception>
#include <iostream>

#include "benchmarks/commands.hpp"
#include "framework/core/malloc_tuning.hpp"

int main(int argc, char** argv) {
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

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);  // also the path of CLI::RuntimeError from a failed subcommand
  } catch (const std::exception& e) {
    std::cerr << "ddp-bench: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
