// The one main of the test suite: Catch2's, or ddp-run's when the suite
// started itself as ddp-run (DDP_TESTS_RUN_AS=ddp-run; apps/ddp_run.hpp).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>

#include "apps/ddp_run.hpp"

int main(int argc, char** argv) {
  if (const char* as = std::getenv("DDP_TESTS_RUN_AS"); as != nullptr && std::strcmp(as, "ddp-run") == 0) {
    return ddpRunMain(argc, argv);
  }
  return Catch::Session().run(argc, argv);
}
