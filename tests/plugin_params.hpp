// For tests that build plugins straight from the registry: the Params that
// experiment validation would hand a factory, and the UsageError a call throws.
#pragma once

#include "framework/core/errors.hpp"
#include "framework/experiment/param.hpp"
#include "framework/experiment/plugin_registry.hpp"

namespace ddp::test {

// Every declared parameter with its default, overridden by `values`.
inline Params paramsFor(const PluginSpec& spec, const Json& values = Json::object()) {
  Json all = Json::object();
  for (const auto& p : spec.params) {
    if (!p.defaultValue.is_null()) all[p.name] = p.defaultValue;
  }
  for (const auto& [key, value] : values.items()) all[key] = value;
  return Params(all);
}

// The message of the UsageError that `fn` throws ("" when none).
template <typename Fn>
std::string usageErrorOf(Fn&& fn) {
  try {
    fn();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

}  // namespace ddp::test
