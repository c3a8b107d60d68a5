// Internal to plugins/: each file registers one kind, and the small helpers
// they share for declaring parameters and reporting bad values.
#pragma once

#include <iomanip>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "framework/core/errors.hpp"
#include "framework/experiment/plugin_registry.hpp"

namespace ddp::plugins {

void registerDatasets(PluginRegistry& registry);
void registerModels(PluginRegistry& registry);
void registerOptimizers(PluginRegistry& registry);
void registerSchedulers(PluginRegistry& registry);
void registerLosses(PluginRegistry& registry);

// Builds a ParamSpec one property at a time, since C++17 has no designated
// initializers: Param("lr", ParamType::Float, 0.01, "learning rate").above(0).
class Param {
 public:
  Param(std::string name, ParamType type, Json defaultValue, std::string doc) {
    spec_.name = std::move(name);
    spec_.type = type;
    spec_.defaultValue = std::move(defaultValue);
    spec_.doc = std::move(doc);
  }
  Param& atLeast(double min) {
    spec_.min = min;
    spec_.minExclusive = false;
    return *this;
  }
  Param& above(double min) {
    spec_.min = min;
    spec_.minExclusive = true;
    return *this;
  }
  // Inclusive, as ParamSpec has it; a factory checks a strict upper bound itself.
  Param& atMost(double max) {
    spec_.max = max;
    return *this;
  }
  Param& oneOf(std::vector<std::string> choices) {
    spec_.choices = std::move(choices);
    return *this;
  }
  operator ParamSpec() const { return spec_; }  // NOLINT: implicit by design, for brace lists

 private:
  ParamSpec spec_;
};

// "optimizer.momentum: must be < 1, got 1".
[[noreturn]] inline void paramError(PluginKind kind, const std::string& param, const std::string& what) {
  throw UsageError(std::string(pluginKindName(kind)) + "." + param + ": " + what);
}

// Formats a parameter value for messages the way the user wrote it.
inline std::string showValue(double value) {
  std::ostringstream os;
  os << std::setprecision(10) << value;
  return os.str();
}

// For the half-open ranges ParamSpec cannot express, e.g. momentum in [0, 1).
inline void requireBelow(PluginKind kind, const std::string& param, double value, double limit) {
  if (!(value < limit)) paramError(kind, param, "must be < " + showValue(limit) + ", got " + showValue(value));
}

}  // namespace ddp::plugins
