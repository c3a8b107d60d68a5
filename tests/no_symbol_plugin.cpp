// A shared library that is not a ddp plugin: it lacks ddp_register_plugins,
// for the test of loadPluginLibrary's error.
extern "C" int ddp_not_a_plugin() { return 42; }
