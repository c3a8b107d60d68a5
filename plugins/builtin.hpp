// The plugins shipped in plugins/ (datasets, models, optimizers, schedulers,
// losses), registered into a PluginRegistry. Registration is explicit, not
// by static initializers, which a static library drops when nothing
// references their object file.
#pragma once

#include "framework/experiment/plugin_registry.hpp"

namespace ddp {

// Registers every built-in plugin; a name already present is a UsageError.
void registerBuiltinPlugins(PluginRegistry& registry);

// A process-wide registry holding the built-in plugins, created on first
// use; plugin libraries that a run loads register into it too.
PluginRegistry& builtinPlugins();

}  // namespace ddp
