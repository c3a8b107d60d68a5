// Plugin parameters: how a plugin declares them (ParamSpec, built with the
// Param builder) and how its factory reads them (Params).
//
// Contract
// - A ParamSpec names one parameter of a plugin: its type, its default (null
//   for a required one), an inclusive range or a list of choices, a one-line
//   doc, and whether it names an input file. Experiment validation checks a
//   config section against the declarations, fills in the defaults, and
//   hands the factory a Params holding every declared name, well typed.
// - Param builds a ParamSpec one property at a time, since C++17 has no
//   designated initializers; it converts to ParamSpec, so a brace list of
//   Params is a std::vector<ParamSpec>:
//       {Param("lr", ParamType::Float, 0.01, "learning rate").above(0),
//        Param("path", ParamType::String, nullptr, "the CSV file").file()}
//   This is public: a plugin library outside the tree declares its
//   parameters the same way as the built-in plugins.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ddp {

using Json = nlohmann::json;

enum class ParamType { Int, Float, Bool, String, IntList, FloatList };

// "int", "float", "bool", "string", "int list", "float list".
inline const char* paramTypeName(ParamType type) {
  switch (type) {
    case ParamType::Int:
      return "int";
    case ParamType::Float:
      return "float";
    case ParamType::Bool:
      return "bool";
    case ParamType::String:
      return "string";
    case ParamType::IntList:
      return "int list";
    case ParamType::FloatList:
      return "float list";
  }
  return "unknown";
}

struct ParamSpec {
  std::string name;
  ParamType type = ParamType::Float;
  Json defaultValue;  // null: required
  std::optional<double> min;  // inclusive bounds for numbers (for lists: each element)
  std::optional<double> max;
  bool minExclusive = false;  // "> 0" rather than ">= 0"
  bool maxExclusive = false;  // "< 1" rather than "<= 1"
  std::vector<std::string> choices;  // for strings, when non-empty
  std::string doc;
  // A string naming an input file: validation checks that it exists and
  // resolves it (against the config's folder, the working folder, then the
  // data folders: $DDP_DATA_DIR, the installed share/ddp, the source tree),
  // so a missing data file fails before anything runs. With a default of
  // "" the file is optional: "" stays "".
  bool isFile = false;
};

// Builds a ParamSpec: Param("lr", ParamType::Float, 0.01, "learning rate").above(0).
class Param {
 public:
  // defaultValue: nullptr for a required parameter.
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
  Param& atMost(double max) {
    spec_.max = max;
    spec_.maxExclusive = false;
    return *this;
  }
  Param& below(double max) {
    spec_.max = max;
    spec_.maxExclusive = true;
    return *this;
  }
  Param& oneOf(std::vector<std::string> choices) {
    spec_.choices = std::move(choices);
    return *this;
  }
  // A string naming an input file (ParamSpec::isFile).
  Param& file() {
    spec_.isFile = true;
    return *this;
  }
  const ParamSpec& spec() const { return spec_; }
  operator ParamSpec() const { return spec_; }  // NOLINT: implicit by design, for brace lists

 private:
  ParamSpec spec_;
};

// A plugin's validated parameters: every declared name present, defaults applied.
class Params {
 public:
  Params() = default;
  explicit Params(Json values) : values_(std::move(values)) {}
  int64_t getInt(const std::string& name) const { return values_.at(name).get<int64_t>(); }
  double getDouble(const std::string& name) const { return values_.at(name).get<double>(); }
  bool getBool(const std::string& name) const { return values_.at(name).get<bool>(); }
  std::string getString(const std::string& name) const { return values_.at(name).get<std::string>(); }
  std::vector<int64_t> getIntList(const std::string& name) const {
    return values_.at(name).get<std::vector<int64_t>>();
  }
  std::vector<double> getDoubleList(const std::string& name) const {
    return values_.at(name).get<std::vector<double>>();
  }
  const Json& json() const { return values_; }

 private:
  Json values_ = Json::object();
};

}  // namespace ddp
