// The backends this build compiled (gloo, nccl), registered into a
// BackendRegistry. Programs choose among them by name at run time; a backend
// that CMake left out is registered as unavailable, so asking for it names
// what was missing and how to enable it.
#pragma once

#include "framework/comm/backend_registry.hpp"

namespace ddp {

// Registers every backend compiled into this build.
void registerBuiltinBackends(BackendRegistry& registry);

// A process-wide registry holding the built-in backends, created on first use.
BackendRegistry& builtinBackends();

}  // namespace ddp
