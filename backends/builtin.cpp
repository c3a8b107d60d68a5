// Registers the backends this build compiled, and explains the missing ones.
#include "backends/builtin.hpp"

#include "ddp/config.hpp"

#if DDP_HAVE_GLOO
#include "backends/gloo/process_group_gloo.hpp"
#endif
#if DDP_HAVE_NCCL
#include "backends/nccl/process_group_nccl.hpp"
#endif

namespace ddp {

BackendRegistry& builtinBackends() {
  static BackendRegistry* registry = [] {
    auto* r = new BackendRegistry();
    registerBuiltinBackends(*r);
    return r;
  }();
  return *registry;
}

void registerBuiltinBackends(BackendRegistry& registry) {
#if DDP_HAVE_GLOO
  registerGlooBackend(registry);
#else
  registry.addUnavailable("gloo",
                          "this build has no Gloo backend (CMake: " DDP_GLOO_STATUS "). HINT: apt-get install "
                          "libgloo-dev if it is missing, then reconfigure with -DDDP_WITH_GLOO=ON");
#endif
#if DDP_HAVE_NCCL
  registerNcclBackend(registry);
#else
  registry.addUnavailable("nccl",
                          "this build has no NCCL backend (CMake: " DDP_NCCL_STATUS "). HINT: configure on a "
                          "machine with the CUDA toolkit and NCCL (set NCCL_HOME if it is outside the toolkit) "
                          "with -DDDP_WITH_NCCL=ON");
#endif
}

}  // namespace ddp
