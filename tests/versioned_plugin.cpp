// A plugin library that loadPluginLibrary must refuse before it registers
// anything: built with DDP_TEST_PLUGIN_API_VERSION it claims that plugin
// API version (not this ddp's), built without it has no
// ddp_plugin_api_version symbol at all. Either way its model
// "refused_model" must not reach the registry.
#include "framework/experiment/plugin_registry.hpp"

#ifdef DDP_TEST_PLUGIN_API_VERSION
static_assert(DDP_TEST_PLUGIN_API_VERSION != DDP_PLUGIN_API_VERSION, "the test needs another version");
extern "C" __attribute__((visibility("default"))) int ddp_plugin_api_version() { return DDP_TEST_PLUGIN_API_VERSION; }
#endif

extern "C" void ddp_register_plugins(ddp::PluginRegistry& registry) {
  registry.add({"refused_model", "must never be registered", {},
                [](const ddp::Params&, const ddp::ModelContext&) -> ddp::ModelPtr { return nullptr; }});
}
