// What the experiment format looks like from outside: describeSection() for
// ddp-run --describe and experimentSchema() for ddp-run --schema.
#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "framework/core/strings.hpp"
#include "framework/experiment/config_detail.hpp"
#include "framework/experiment/experiment_config.hpp"

namespace ddp {
namespace {

using config_detail::kPluginSections;

}  // namespace

std::optional<std::string> describeSection(const std::string& section, const PluginRegistry& registry) {
  if (section == "training") {
    return "training: how each rank trains (the experiment's \"training\" object; --set training.KEY=VALUE)\n" +
           describeParams(trainingParamSpecs(),
                          {{"early_stopping", "object", "null", "",
                            "stop when a metric stops improving: {\"monitor\": ..., \"mode\": ..., \"patience\": ..., "
                            "\"min_delta\": ...}; --describe training.early_stopping"}});
  }
  if (section == "training.early_stopping") {
    return "training.early_stopping: stop training when the monitored metric has not improved for `patience` "
           "evaluations; rank 0 decides and every rank stops after the same epoch (null or absent: off; --set "
           "training.early_stopping.KEY=VALUE turns it on)\n" +
           describeParams(earlyStoppingParamSpecs());
  }
  if (section == "distributed") {
    const std::string hooks = joinNames(registry.names(PluginKind::CommHook));
    return "distributed: how the ranks work together (the experiment's \"distributed\" object; --set "
           "distributed.KEY=VALUE)\n" +
           describeParams(distributedParamSpecs(),
                          {{"comm_hook", "plugin", "(allreduce)", hooks,
                            "how DDP averages gradient buckets: a name, or {\"name\": ..., params}; --describe "
                            "comm_hook.NAME"}});
  }
  if (section == "plugins") {
    std::vector<std::vector<std::string>> rows;
    rows.push_back({"name", "string", "\"\"", "one folder name",
                    "names the run folder runs/<name>-<time> (no '/', '\\', '..', control characters or leading '.')"});
    rows.push_back({"description", "string", "\"\"", "", "a comment, kept in config.json"});
    rows.push_back({"$schema", "string", "", "", "where an editor finds ddp-run --schema's output; ignored"});
    rows.push_back({"plugins", "list", "[]", "",
                    "shared libraries of plugins to load first (relative paths: the experiment's folder, the working "
                    "folder, then the data folders); ddp-run --plugin-lib loads one for --list-plugins and --describe"});
    for (const auto& [key, kind] : kPluginSections) {
      const bool optional = kind == PluginKind::Scheduler;
      rows.push_back({key, "plugin", optional ? "(none)" : "(required)", joinNames(registry.names(kind)),
                      fmt::format("a name, or {{\"name\": ..., params}}; --describe {}.NAME", pluginKindName(kind))});
    }
    rows.push_back({"training", "object", "{}", "", "--describe training"});
    rows.push_back({"distributed", "object", "{}", "", "--describe distributed"});
    return "the keys of an experiment file (JSON; any other key is refused)\n" + describeParams({}, rows);
  }
  return std::nullopt;
}

namespace {

// One declared parameter as a JSON Schema.
Json paramSchema(const ParamSpec& spec) {
  Json out = Json::object();
  auto bounds = [&](Json& number) {
    if (spec.min) number[spec.minExclusive ? "exclusiveMinimum" : "minimum"] = *spec.min;
    if (spec.max) number[spec.maxExclusive ? "exclusiveMaximum" : "maximum"] = *spec.max;
  };
  switch (spec.type) {
    case ParamType::Int:
      out["type"] = "integer";
      bounds(out);
      break;
    case ParamType::Float:
      out["type"] = "number";
      bounds(out);
      break;
    case ParamType::Bool:
      out["type"] = "boolean";
      break;
    case ParamType::String:
      out["type"] = "string";
      if (!spec.choices.empty()) out["enum"] = spec.choices;
      break;
    case ParamType::IntList:
    case ParamType::FloatList: {
      Json item = {{"type", spec.type == ParamType::IntList ? "integer" : "number"}};
      bounds(item);
      out["type"] = "array";
      out["items"] = item;
      break;
    }
  }
  out["description"] = spec.isFile ? spec.doc + " (a file: relative to the experiment's folder, the working folder "
                                                "or the data folders)"
                                   : spec.doc;
  if (!spec.defaultValue.is_null()) out["default"] = spec.defaultValue;
  return out;
}

// An object of declared parameters; `extra` adds properties (a plugin's "name").
Json objectSchema(const std::vector<ParamSpec>& specs, const std::string& description, Json extra = Json::object(),
                  std::vector<std::string> required = {}) {
  Json properties = std::move(extra);
  for (const ParamSpec& spec : specs) {
    properties[spec.name] = paramSchema(spec);
    if (spec.defaultValue.is_null()) required.push_back(spec.name);
  }
  Json out = {{"type", "object"}, {"description", description}, {"properties", properties},
              {"additionalProperties", false}};
  if (!required.empty()) out["required"] = required;
  return out;
}

// A plugin section: a name, or {"name": NAME, that plugin's parameters}.
Json pluginSchema(const PluginRegistry& registry, PluginKind kind, const std::string& description) {
  const std::vector<std::string> names = registry.names(kind);
  // The name alone only for plugins whose every parameter has a default.
  std::vector<std::string> byName;
  for (const std::string& name : names) {
    const auto& params = registry.get(kind, name).params;
    if (std::all_of(params.begin(), params.end(), [](const ParamSpec& p) { return !p.defaultValue.is_null(); })) {
      byName.push_back(name);
    }
  }
  Json choices = Json::array();
  choices.push_back({{"type", "string"}, {"enum", byName}, {"description", "a plugin's name, with its defaults"}});
  for (const std::string& name : names) {
    const PluginSpec& spec = registry.get(kind, name);
    choices.push_back(objectSchema(spec.params, fmt::format("{}.{}: {}", pluginKindName(kind), name, spec.doc),
                                   Json{{"name", {{"const", name}}}}, {"name"}));
  }
  return {{"description", description}, {"oneOf", choices}};
}

}  // namespace

Json experimentSchema(const PluginRegistry& registry) {
  Json properties = Json::object();
  properties["$schema"] = {{"type", "string"}, {"description", "where editors find this schema; ignored"}};
  properties["name"] = {{"type", "string"},
                        {"description", "names the run folder runs/<name>-<time>"},
                        {"pattern", R"(^(?!\.)(?!.*\.\.)[^/\\\x00-\x1f]*$)"}};
  properties["description"] = {{"type", "string"}, {"description", "a comment, kept in config.json"}};
  properties["plugins"] = {{"type", "array"},
                           {"items", {{"type", "string"}}},
                           {"description", "shared libraries of plugins to load first (paths from the file)"}};
  for (const auto& [key, kind] : kPluginSections) {
    properties[key] = pluginSchema(registry, kind, fmt::format("the {} (ddp-run --describe {}.NAME)",
                                                               pluginKindName(kind), pluginKindName(kind)));
  }
  Json earlyStopping = objectSchema(earlyStoppingParamSpecs(),
                                    "stop when a metric stops improving (ddp-run --describe training.early_stopping)");
  properties["training"] = objectSchema(
      trainingParamSpecs(), "how each rank trains (ddp-run --describe training)",
      Json{{"early_stopping", {{"description", "stop when a metric stops improving; null: off"},
                               {"oneOf", Json::array({Json{{"type", "null"}}, earlyStopping})}}}});
  properties["training"]["properties"]["keep_best_by"]["enum"] = [] {
    Json names = Json::array({""});
    for (const std::string& name : monitorNames()) names.push_back(name);
    return names;
  }();
  properties["distributed"] = objectSchema(
      distributedParamSpecs(), "how the ranks work together (ddp-run --describe distributed)",
      Json{{"comm_hook", pluginSchema(registry, PluginKind::CommHook,
                                      "how DDP averages gradient buckets (default allreduce)")}});
  Json required = Json::array();
  for (const auto& [key, kind] : kPluginSections) {
    if (kind != PluginKind::Scheduler) required.push_back(key);
  }
  return {{"$schema", "https://json-schema.org/draft/2020-12/schema"},
          {"title", "ddp experiment"},
          {"description", "An experiment file for ddp-run (docs/experiments.md). Plugins that a library in "
                          "\"plugins\" registers are known to the schema only when it was printed with "
                          "ddp-run --plugin-lib LIBRARY --schema."},
          {"type", "object"},
          {"properties", properties},
          {"required", required},
          {"additionalProperties", false}};
}

}  // namespace ddp
