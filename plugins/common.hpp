// Internal to plugins/: each file registers one kind, and the small helpers
// they share for reporting bad parameter values. (Parameters are declared
// with the public Param builder, framework/experiment/param.hpp.)
#pragma once

#include <fmt/format.h>

#include <iomanip>
#include <sstream>
#include <string>
#include <utility>

#include "framework/core/errors.hpp"
#include "framework/core/strings.hpp"
#include "framework/experiment/param.hpp"
#include "framework/experiment/plugin_registry.hpp"

namespace ddp::plugins {

void registerDatasets(PluginRegistry& registry);
void registerModels(PluginRegistry& registry);
void registerOptimizers(PluginRegistry& registry);
void registerSchedulers(PluginRegistry& registry);
void registerLosses(PluginRegistry& registry);
void registerCommHooks(PluginRegistry& registry);

// The kind each plugin file registers, named once for all of them.
inline constexpr PluginKind kDataset = PluginKind::Dataset;
inline constexpr PluginKind kModel = PluginKind::Model;
inline constexpr PluginKind kOptimizer = PluginKind::Optimizer;
inline constexpr PluginKind kLoss = PluginKind::Loss;

// "optimizer.momentum: must be < 1, got 1": a UsageError naming the
// parameter, its message built by fmt.
template <typename... Args>
[[noreturn]] void paramError(PluginKind kind, const std::string& param, fmt::format_string<Args...> what,
                             Args&&... args) {
  fail<UsageError>("{}.{}: {}", pluginKindName(kind), param, fmt::format(what, std::forward<Args>(args)...));
}

// For the half-open ranges ParamSpec cannot express, e.g. momentum in [0, 1).
inline void requireBelow(PluginKind kind, const std::string& param, double value, double limit) {
  if (!(value < limit)) paramError(kind, param, "must be < {}, got {}", showNumber(limit), showNumber(value));
}

}  // namespace ddp::plugins
