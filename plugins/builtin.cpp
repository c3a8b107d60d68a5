// The plugins shipped with the framework, registered explicitly rather than
// by static initializers, which a static library drops when nothing
// references their object file.
#include "plugins/builtin.hpp"

namespace ddp {

void registerBuiltinPlugins(PluginRegistry& registry) {
  plugins::registerDatasets(registry);
  plugins::registerModels(registry);
  plugins::registerOptimizers(registry);
  plugins::registerSchedulers(registry);
  plugins::registerLosses(registry);
}

}  // namespace ddp
