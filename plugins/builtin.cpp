#include "plugins/builtin.hpp"

#include "plugins/common.hpp"

namespace ddp {

void registerBuiltinPlugins(PluginRegistry& registry) {
  plugins::registerDatasets(registry);
  plugins::registerModels(registry);
  plugins::registerOptimizers(registry);
  plugins::registerSchedulers(registry);
  plugins::registerLosses(registry);
  plugins::registerCommHooks(registry);
}

PluginRegistry& builtinPlugins() {
  // Never destroyed: factories loaded from plugin libraries must outlive every
  // static destructor that might still call them.
  static PluginRegistry* registry = [] {
    auto* r = new PluginRegistry;
    registerBuiltinPlugins(*r);
    return r;
  }();
  return *registry;
}

}  // namespace ddp
