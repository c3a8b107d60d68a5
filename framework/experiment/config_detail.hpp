// Private to the experiment-config files (experiment_config.cpp parses,
// config_sections.cpp declares the built-in sections, config_schema.cpp
// describes): not part of the API, though installed with the other headers.
// It holds the top level of an experiment file, its keys and its plugin
// sections, which parsing, --describe plugins and --schema all follow.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "framework/experiment/plugin_registry.hpp"

namespace ddp::config_detail {

// "$schema": where an editor finds the JSON Schema (ddp-run --schema); ignored.
inline const std::vector<std::string> kTopLevelKeys = {
    "name", "description", "plugins", "dataset", "model", "optimizer", "scheduler", "loss", "training", "distributed",
    "$schema"};
inline const std::vector<std::pair<std::string, PluginKind>> kPluginSections = {
    {"dataset", PluginKind::Dataset},
    {"model", PluginKind::Model},
    {"optimizer", PluginKind::Optimizer},
    {"scheduler", PluginKind::Scheduler},
    {"loss", PluginKind::Loss}};

}  // namespace ddp::config_detail
