#include "framework/experiment/experiment_config.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "ddp/config.hpp"
#include "framework/core/data_dirs.hpp"
#include "framework/core/strings.hpp"
#include "framework/core/system.hpp"
#include "framework/experiment/config_detail.hpp"

namespace ddp {
namespace {

using config_detail::kPluginSections;
using config_detail::kTopLevelKeys;

std::string inQuotes(const std::string& s) { return "\"" + s + "\""; }

std::string shown(const Json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

std::string formatNumber(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// "a number > 0", "an integer in [1, 100]", "true or false", ...
std::string expectation(const ParamSpec& p) {
  std::string range;
  if (p.min && p.max) {
    range = fmt::format(" in {}{}, {}{}", p.minExclusive ? "(" : "[", formatNumber(*p.min), formatNumber(*p.max),
                        p.maxExclusive ? ")" : "]");
  } else if (p.min) {
    range = fmt::format(" {} {}", p.minExclusive ? ">" : ">=", formatNumber(*p.min));
  } else if (p.max) {
    range = fmt::format(" {} {}", p.maxExclusive ? "<" : "<=", formatNumber(*p.max));
  }
  switch (p.type) {
    case ParamType::Int: return "an integer" + range;
    case ParamType::Float: return "a number" + range;
    case ParamType::Bool: return "true or false";
    case ParamType::String: {
      if (p.choices.empty()) return p.isFile ? "a file path" : "a string";
      std::string s = "one of ";
      for (size_t i = 0; i < p.choices.size(); ++i) s += (i ? ", " : "") + inQuotes(p.choices[i]);
      return s;
    }
    case ParamType::IntList: return "a list of integers" + (range.empty() ? "" : " each" + range);
    case ParamType::FloatList: return "a list of numbers" + (range.empty() ? "" : " each" + range);
  }
  return "?";
}

bool inRange(const ParamSpec& p, double v) {
  if (!std::isfinite(v)) return false;
  if (p.min && (p.minExclusive ? v <= *p.min : v < *p.min)) return false;
  if (p.max && (p.maxExclusive ? v >= *p.max : v > *p.max)) return false;
  return true;
}

// Integers are held as int64 and used in sizes and counts: beyond 9e15 in
// magnitude (where doubles stop counting exactly) they are refused, so that
// 18446744073709551615 is not read as -1.
constexpr double kMaxIntegerMagnitude = 9e15;

bool tooLargeInteger(const Json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>() >= static_cast<uint64_t>(kMaxIntegerMagnitude);
  if (v.is_number_integer()) return std::fabs(static_cast<double>(v.get<int64_t>())) >= kMaxIntegerMagnitude;
  return false;
}

bool isInteger(const Json& v) {
  if (v.is_number_integer()) return !tooLargeInteger(v);
  if (v.is_number_float()) {
    double d = v.get<double>();
    return std::isfinite(d) && d == std::floor(d) && std::fabs(d) < kMaxIntegerMagnitude;
  }
  return false;
}

bool fileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// Absolute, without "." parts ("/data/./x.csv" is "/data/x.csv"). ".." stays:
// after a symbolic link it does not mean the folder above in the text.
std::string withoutDots(const std::filesystem::path& path) {
  std::filesystem::path out;
  for (const auto& part : path) {
    if (part == "." || part.empty()) continue;
    out /= part;
  }
  return out.string();
}

std::string absolutePath(const std::string& path) {
  if (!path.empty() && path[0] == '/') return withoutDots(path);
  char cwd[4096];
  if (::getcwd(cwd, sizeof(cwd))) return withoutDots(std::filesystem::path(cwd) / path);
  return path;
}

// The folders resolveFile() looks in, for errors.
std::string lookedIn(const std::string& configDir) {
  std::string looked = configDir.empty() ? std::string() : configDir + ", ";
  looked += "the working folder";
  for (const std::string& dir : dataSearchDirs()) looked += ", " + dir;
  return looked;
}

// Where an input file named in a config is looked for, in order.
std::optional<std::string> resolveFile(const std::string& path, const std::string& configDir) {
  if (path.empty()) return std::nullopt;
  if (path[0] == '/') return fileExists(path) ? std::optional<std::string>(absolutePath(path)) : std::nullopt;
  std::vector<std::string> bases = {configDir, "."};
  for (const std::string& dir : dataSearchDirs()) bases.push_back(dir);
  for (const std::string& base : bases) {
    if (base.empty()) continue;
    std::string candidate = base + "/" + path;
    if (fileExists(candidate)) return absolutePath(candidate);
  }
  return std::nullopt;
}

// Overrides typed by the declaration: "--set optimizer.lr=0.01".
struct Override {
  std::string path;  // "optimizer.lr"
  std::string raw;   // "0.01"
  bool used = false;
};

Json typedOverride(const Override& o, const ParamSpec* spec) {
  const std::string& raw = o.raw;
  if (spec && spec->type == ParamType::String) return raw;
  // Anything else reads as JSON ("0.01", "true", "[13, 64, 3]"); what does not
  // parse stays a string so that validation reports it with the expectation.
  Json v = Json::parse(raw, nullptr, /*allow_exceptions=*/false);
  if (v.is_discarded()) {
    try {
      const Json overflow = Json::parse(raw);  // throws: it did not parse above
    } catch (const Json::out_of_range&) {  // 406: a number beyond a double's range
      fail<ConfigError>("--set {}: number {} is beyond the range of a double (about 1.8e308)", o.path, raw);
    } catch (const Json::exception&) {
    }
    return raw;
  }
  return v;
}

class Validator {
 public:
  Validator(std::string sourceName, std::string configDir, std::vector<Override>& overrides)
      : sourceName_(std::move(sourceName)), configDir_(std::move(configDir)), overrides_(overrides) {}

  // Where each key is declared ("lr" -> optimizer), for a key given in the
  // wrong section (training.lr).
  void setHomes(std::map<std::string, std::set<std::string>> homes) { homes_ = std::move(homes); }

  // A ConfigError "PATH: MESSAGE", the message built by fmt.
  template <typename... Args>
  [[noreturn]] void fail(const std::string& path, fmt::format_string<Args...> message, Args&&... args) const {
    ddp::fail<ConfigError>("{}: {}", path, fmt::format(message, std::forward<Args>(args)...));
  }

  // Checks `section` (a JSON object at `path`) against `specs`, applies the
  // overrides under `path`, and returns the section with defaults filled in.
  // `reserved` keys (e.g. "name") are allowed and left alone.
  // describeName: what `ddp-run --describe` takes for these keys (a
  // plugin's KIND.NAME); "" for `path` itself.
  Json validateSection(const std::string& path, const Json& section, const std::vector<ParamSpec>& specs,
                       const std::set<std::string>& reserved = {}, const std::string& describeName = "") {
    const std::string hint =
        fmt::format(". HINT: ddp-run --describe {} lists them", describeName.empty() ? path : describeName);
    if (!section.is_object()) fail(path, "expected an object, got {}", shown(section));
    std::map<std::string, const ParamSpec*> byName;
    std::vector<std::string> known(reserved.begin(), reserved.end());
    for (const auto& s : specs) {
      byName[s.name] = &s;
      known.push_back(s.name);
    }
    Json values = section;
    for (auto& o : overrides_) {
      if (o.path.rfind(path + ".", 0) != 0) continue;
      std::string key = o.path.substr(path.size() + 1);
      if (reserved.count(key) || reserved.count(key.substr(0, key.find('.')))) continue;  // handled by the caller
      auto it = byName.find(key);
      if (it == byName.end()) {
        fail("--set " + o.path, "unknown key{}{}", suggestion(key, known), elsewhere(path, key, hint));
      }
      values[key] = typedOverride(o, it->second);
      o.used = true;
    }
    Json out = Json::object();
    for (auto it = values.begin(); it != values.end(); ++it) {
      if (reserved.count(it.key())) {
        out[it.key()] = it.value();
        continue;
      }
      if (!byName.count(it.key())) {
        fail(path + "." + it.key(), "unknown key{}{}", suggestion(it.key(), known), elsewhere(path, it.key(), hint));
      }
    }
    for (const auto& spec : specs) {
      const std::string where = path + "." + spec.name;
      if (!values.contains(spec.name)) {
        if (spec.defaultValue.is_null()) fail(where, "required parameter is missing ({})", spec.doc);
        out[spec.name] = spec.defaultValue;
        // An optional file ("" by default) that is not given stays "".
        if (!spec.isFile || spec.defaultValue == Json("")) continue;
      }
      out[spec.name] = checkValue(where, spec, values.contains(spec.name) ? values[spec.name] : spec.defaultValue);
    }
    return out;
  }

 private:
  // The HINT for an unknown key: the section that declares it (or its
  // usual spelling there), else `fallback`.
  std::string elsewhere(const std::string& path, const std::string& key, const std::string& fallback) const {
    static const std::map<std::string, std::string> spellings = {
        {"learning_rate", "lr"},  {"num_epochs", "epochs"},          {"n_epochs", "epochs"},
        {"batchsize", "batch_size"}, {"world_size", "nproc_per_node"}, {"nproc", "nproc_per_node"}};
    const auto spelled = spellings.find(key);
    const std::string name = spelled != spellings.end() ? spelled->second : key;
    const auto it = homes_.find(name);
    if (it == homes_.end()) return fallback;
    std::vector<std::string> others;
    for (const std::string& section : it->second) {
      if (section != path) others.push_back(section);
    }
    if (others.empty()) {
      return name == key ? fallback : fmt::format(". HINT: this section calls it {}: {}.{}", inQuotes(name), path, name);
    }
    return fmt::format(". HINT: {} belongs in {}: {}.{}", inQuotes(name), fmt::join(others, " or "), others.front(),
                       name);
  }

  std::string suggestion(const std::string& key, const std::vector<std::string>& known) const {
    const std::string close = closestName(key, known);
    return fmt::format("{} (known: {})", close.empty() ? "" : fmt::format("; did you mean {}?", inQuotes(close)),
                       fmt::join(known, ", "));
  }

  Json checkValue(const std::string& where, const ParamSpec& spec, const Json& v) const {
    auto wrong = [&]() {
      if (tooLargeInteger(v)) fail(where, "expected {}, got {}, beyond the largest integer accepted (9e15)",
                                   expectation(spec), shown(v));
      fail(where, "expected {}, got {}", expectation(spec), shown(v));
    };
    switch (spec.type) {
      case ParamType::Int:
        if (!isInteger(v) || !inRange(spec, v.get<double>())) wrong();
        return v.get<int64_t>();
      case ParamType::Float:
        if (!v.is_number() || !inRange(spec, v.get<double>())) wrong();
        return v.get<double>();
      case ParamType::Bool:
        if (!v.is_boolean()) wrong();
        return v;
      case ParamType::String: {
        if (!v.is_string()) wrong();
        const std::string s = v.get<std::string>();
        if (!spec.choices.empty() && std::find(spec.choices.begin(), spec.choices.end(), s) == spec.choices.end()) {
          std::string close = closestName(s, spec.choices);
          fail(where, "expected {}, got {}{}", expectation(spec), shown(v),
               close.empty() ? "" : fmt::format("; did you mean {}?", inQuotes(close)));
        }
        if (spec.isFile && !s.empty()) {
          auto found = resolveFile(s, configDir_);
          std::error_code ec;
          if (!found) {
            for (const std::string& candidate :
                 {s[0] == '/' ? s : (configDir_.empty() ? s : configDir_ + "/" + s), s}) {
              if (std::filesystem::is_directory(candidate, ec)) {
                fail(where, "{} is a folder, not a file", inQuotes(s));
              }
            }
          }
          if (!found) fail(where, "file {} not found (looked in {})", inQuotes(s), lookedIn(configDir_));
          return *found;
        }
        return v;
      }
      case ParamType::IntList:
      case ParamType::FloatList: {
        if (!v.is_array()) wrong();
        for (const auto& e : v) {
          if (spec.type == ParamType::IntList ? !isInteger(e) : !e.is_number()) wrong();
          if (!inRange(spec, e.get<double>())) wrong();
        }
        return v;
      }
    }
    return v;
  }

  std::string sourceName_;
  std::string configDir_;
  std::vector<Override>& overrides_;
  std::map<std::string, std::set<std::string>> homes_;
};

std::vector<Override> parseOverrides(const std::vector<std::string>& overrides) {
  std::vector<Override> out;
  for (const auto& text : overrides) {
    auto eq = text.find('=');
    if (eq == std::string::npos || eq == 0) {
      fail<ConfigError>("--set {}: expected KEY=VALUE, e.g. --set optimizer.lr=0.01", text);
    }
    std::string path = text.substr(0, eq);
    const bool pluginSection = std::any_of(kPluginSections.begin(), kPluginSections.end(),
                                           [&](const auto& section) { return section.first == path; });
    if (path.find('.') == std::string::npos && path != "name" && !pluginSection) {
      fail<ConfigError>("--set {}: expected SECTION.KEY=VALUE, e.g. --set training.epochs=5", text);
    }
    out.push_back({path, text.substr(eq + 1)});
  }
  return out;
}

// "file.json:3:14: REASON", the line and column counted from nlohmann's
// byte offset (one past the character where reading stopped).
[[noreturn]] void failAt(const std::string& text, const std::string& sourceName, size_t byte,
                         const std::string& reason) {
  size_t line = 1, column = 1;
  const size_t end = std::min<size_t>(byte == 0 ? 0 : byte - 1, text.size());
  for (size_t i = 0; i < end; ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  fail<ConfigError>("{}:{}:{}: {}", sourceName, line, column, reason);
}

// One pass of nlohmann's SAX parser over an experiment before it is read:
// every error becomes one line with its line and column (nlohmann's
// exception for a number beyond a double's range carries no position), and
// a key given twice in one object, at any depth, is refused (nlohmann keeps
// the last one silently). Paths read as in other errors: model.layers,
// plugins[0].
class StrictJsonCheck : public nlohmann::json_sax<Json> {
 public:
  StrictJsonCheck(const std::string& text, const std::string& sourceName) : text_(text), sourceName_(sourceName) {}

  bool null() override { return value(); }
  bool boolean(bool) override { return value(); }
  bool number_integer(number_integer_t) override { return value(); }
  bool number_unsigned(number_unsigned_t) override { return value(); }
  bool number_float(number_float_t, const string_t&) override { return value(); }
  bool string(string_t&) override { return value(); }
  bool binary(binary_t&) override { return value(); }
  bool start_object(std::size_t) override {
    value();
    frames_.emplace_back();
    return true;
  }
  bool key(string_t& key) override {
    Frame& frame = frames_.back();
    frame.key = key;
    if (!frame.keys.insert(key).second) {
      fail<ConfigError>("{}: duplicate key {}: a key may appear once in an object (the second would silently replace "
                        "the first). HINT: keep one of them",
                        sourceName_, inQuotes(path()));
    }
    return true;
  }
  bool end_object() override {
    frames_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override {
    value();
    frames_.emplace_back();
    frames_.back().array = true;
    return true;
  }
  bool end_array() override {
    frames_.pop_back();
    return true;
  }
  bool parse_error(std::size_t position, const std::string& token, const nlohmann::detail::exception& e) override {
    if (e.id == 406) {
      failAt(text_, sourceName_, position - std::min(position, token.size()) + 1,
             fmt::format("number {} is beyond the range of a double (about 1.8e308)", token));
    }
    std::string what = e.what();
    // nlohmann's text repeats the position; keep its reason only.
    auto reason = what.find("syntax error");
    if (reason != std::string::npos) what = what.substr(reason);
    failAt(text_, sourceName_, position, "malformed JSON: " + what);
  }

 private:
  struct Frame {
    bool array = false;
    int64_t index = -1;  // the element being read, in an array
    std::string key;     // the member being read, in an object
    std::set<std::string> keys;
  };

  // A value starts: in an array, the next element.
  bool value() {
    if (!frames_.empty() && frames_.back().array) ++frames_.back().index;
    return true;
  }

  std::string path() const {
    std::string out;
    for (const Frame& frame : frames_) {
      if (frame.array) {
        out += fmt::format("[{}]", frame.index);
      } else {
        out += (out.empty() ? "" : ".") + frame.key;
      }
    }
    return out;
  }

  const std::string& text_;
  const std::string& sourceName_;
  std::vector<Frame> frames_;
};

// The run folder is runs/<name>-<time>: a name must stay one folder name
// inside runs/.
void checkExperimentName(const std::string& name, const std::string& where) {
  const bool bad = name.find('/') != std::string::npos || name.find('\\') != std::string::npos ||
                   name.find("..") != std::string::npos || (!name.empty() && name[0] == '.') ||
                   std::any_of(name.begin(), name.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20; });
  if (bad) {
    fail<ConfigError>("{}: {} cannot name a run folder (no '/', '\\', '..', control characters or leading '.'). "
                      "HINT: letters, digits, '-', '_' and single dots, e.g. \"wine-lr-0.01\"",
                      where, inQuotes(name));
  }
}

}  // namespace

ExperimentConfig parseExperimentConfig(const std::string& text, const std::string& sourceName,
                                       const std::string& configDir, const std::vector<std::string>& overrideTexts,
                                       PluginRegistry& registry) {
  StrictJsonCheck check(text, sourceName);
  Json::sax_parse(text, &check);  // throws a ConfigError for anything it refuses
  Json root = Json::parse(text);
  if (!root.is_object()) fail<ConfigError>("{}: expected a JSON object at the top level", sourceName);

  std::vector<Override> overrides = parseOverrides(overrideTexts);
  Validator v(sourceName, configDir, overrides);
  {
    std::map<std::string, std::set<std::string>> homes;
    for (const ParamSpec& p : trainingParamSpecs()) homes[p.name].insert("training");
    for (const ParamSpec& p : distributedParamSpecs()) homes[p.name].insert("distributed");
    for (const auto& [section, kind] : kPluginSections) {
      for (const std::string& name : registry.names(kind)) {
        for (const ParamSpec& p : registry.get(kind, name).params) homes[p.name].insert(section);
      }
    }
    v.setHomes(std::move(homes));
  }
  for (auto it = root.begin(); it != root.end(); ++it) {
    if (std::find(kTopLevelKeys.begin(), kTopLevelKeys.end(), it.key()) == kTopLevelKeys.end()) {
      std::string close = closestName(it.key(), kTopLevelKeys);
      fail<ConfigError>("{}: unknown key{} (known: {}). HINT: ddp-run --describe plugins lists the keys of an "
                        "experiment file",
                        it.key(), close.empty() ? "" : fmt::format("; did you mean {}?", inQuotes(close)),
                        fmt::join(kTopLevelKeys, ", "));
    }
  }
  for (auto& o : overrides) {
    std::string section = o.path.substr(0, o.path.find('.'));
    if (std::find(kTopLevelKeys.begin(), kTopLevelKeys.end(), section) == kTopLevelKeys.end()) {
      std::string close = closestName(section, kTopLevelKeys);
      fail<ConfigError>("--set {}: unknown section {}{}. HINT: ddp-run --describe plugins lists the sections",
                        o.path, inQuotes(section),
                        close.empty() ? "" : fmt::format("; did you mean {}?", inQuotes(close)));
    }
    if (o.path == "name") {
      root["name"] = o.raw;
      o.used = true;
    }
  }

  ExperimentConfig config;
  config.sourcePath = sourceName;
  config.configDir = configDir;
  Json resolved = Json::object();
  if (root.contains("name")) {
    if (!root["name"].is_string()) v.fail("name", "expected a string, got {}", shown(root["name"]));
    config.name = root["name"].get<std::string>();
    checkExperimentName(config.name, "name");
  }
  resolved["name"] = config.name;
  if (root.contains("description")) {
    if (!root["description"].is_string()) {
      v.fail("description", "expected a string, got {}", shown(root["description"]));
    }
    resolved["description"] = root["description"];
  }

  // Plugin libraries first: their plugins may be named below.
  if (root.contains("plugins")) {
    const Json& libs = root["plugins"];
    if (!libs.is_array()) v.fail("plugins", "expected a list of shared library paths, got {}", shown(libs));
    for (size_t i = 0; i < libs.size(); ++i) {
      const std::string where = fmt::format("plugins[{}]", i);
      if (!libs[i].is_string()) v.fail(where, "expected a path, got {}", shown(libs[i]));
      auto found = resolveFile(libs[i].get<std::string>(), configDir);
      if (!found) {
        v.fail(where,
               "plugin library {} not found (looked in {}). HINT: a relative path is taken from the experiment's "
               "folder first; give the library's path, e.g. \"build/libmy_plugins.so\"",
               inQuotes(libs[i].get<std::string>()), lookedIn(configDir));
      }
      try {
        loadPluginLibrary(*found, registry);
      } catch (const std::exception& e) {
        v.fail(where, "{}", e.what());
      }
      config.pluginLibraries.push_back(*found);
    }
  }
  resolved["plugins"] = config.pluginLibraries;

  // A plugin section: a name, or an object with "name" and the plugin's
  // parameters. --set SECTION=NAME and --set SECTION.name=NAME both choose it.
  auto choosePlugin = [&](const std::string& section, PluginKind kind, Json body,
                          bool optional) -> std::optional<std::pair<PluginChoice, Json>> {
    const std::string known = joinNames(registry.names(kind));  // "mlp, linear": for errors listing what exists
    bool renamed = false;
    for (auto& o : overrides) {
      if (o.path == section + ".name" || o.path == section) {
        if (body.is_string()) body = Json{{"name", body}};
        if (body.is_null()) body = Json::object();
        if (body.is_object()) {
          renamed = renamed || !body.contains("name") || body["name"] != o.raw;
          body["name"] = o.raw;
        }
        o.used = true;
      }
    }
    if (body.is_null()) {
      if (optional) return std::nullopt;
      fail<ConfigError>("{}: required section is missing; it names a {} plugin, e.g. {}: {{\"name\": {}}}", section,
                        pluginKindName(kind), inQuotes(section),
                        inQuotes(registry.names(kind).empty() ? std::string("...") : registry.names(kind).front()));
    }
    if (body.is_string()) body = Json{{"name", body}};
    if (!body.is_object()) v.fail(section, "expected an object with a \"name\", got {}", shown(body));
    if (!body.contains("name") || !body["name"].is_string()) {
      v.fail(section + ".name", "required: the {} to use (known: {})", pluginKindName(kind), known);
    }
    const std::string name = body["name"].get<std::string>();
    if (!registry.has(kind, name)) {
      std::string close = closestName(name, registry.names(kind));
      v.fail(section + ".name", "unknown {} {}{} (known: {})", pluginKindName(kind), inQuotes(name),
             close.empty() ? "" : fmt::format("; did you mean {}?", inQuotes(close)), known);
    }
    const PluginSpec& spec = registry.get(kind, name);
    if (renamed) {
      // Switched by --set: the file's parameters carry over where the new
      // plugin declares them (an optimizer's lr), the others are dropped.
      Json kept = Json{{"name", name}};
      for (const auto& p : spec.params) {
        if (body.contains(p.name)) kept[p.name] = body[p.name];
      }
      body = kept;
    }
    Json params =
        v.validateSection(section, body, spec.params, {"name"}, fmt::format("{}.{}", pluginKindName(kind), name));
    Json shownParams = params;
    params.erase("name");
    return std::make_pair(PluginChoice{name, Params(params)}, shownParams);
  };

  for (const auto& [section, kind] : kPluginSections) {
    auto chosen = choosePlugin(section, kind, root.contains(section) ? root[section] : Json(),
                               /*optional=*/kind == PluginKind::Scheduler);
    if (!chosen) continue;
    resolved[section] = chosen->second;
    const PluginChoice& choice = chosen->first;
    switch (kind) {
      case PluginKind::Dataset: config.dataset = choice; break;
      case PluginKind::Model: config.model = choice; break;
      case PluginKind::Optimizer: config.optimizer = choice; break;
      case PluginKind::Scheduler: config.scheduler = choice; break;
      case PluginKind::Loss: config.loss = choice; break;
      case PluginKind::CommHook: break;  // not a top-level section: distributed.comm_hook
    }
  }

  // training.early_stopping is an object of its own (null: off); --set
  // training.early_stopping.KEY=VALUE turns it on with that value.
  Json trainingBody = root.contains("training") ? root["training"] : Json::object();
  Json earlyBody;
  if (trainingBody.is_object() && trainingBody.contains("early_stopping")) {
    earlyBody = trainingBody["early_stopping"];
    trainingBody.erase("early_stopping");
  }
  for (auto& o : overrides) {
    if (o.path != "training.early_stopping") continue;
    earlyBody = typedOverride(o, nullptr);
    if (earlyBody == Json("off")) earlyBody = Json();
    o.used = true;
  }
  const bool earlyOverridden = std::any_of(overrides.begin(), overrides.end(), [](const Override& o) {
    return o.path.rfind("training.early_stopping.", 0) == 0;
  });
  if (earlyBody.is_null() && earlyOverridden) earlyBody = Json::object();
  Json training = v.validateSection("training", trainingBody, trainingParamSpecs(), {"early_stopping"});
  if (!earlyBody.is_null()) {
    if (!earlyBody.is_object()) {
      v.fail("training.early_stopping",
             "expected an object such as {{\"monitor\": \"test_loss\", \"patience\": 3}}, or null for off, got {}",
             shown(earlyBody));
    }
    const Json early = v.validateSection("training.early_stopping", earlyBody, earlyStoppingParamSpecs(), {},
                                         "training.early_stopping");
    TrainingConfig::EarlyStopping e;
    e.monitor = early["monitor"];
    e.maximize = early["mode"] == "max" || (early["mode"] == "auto" && largerIsBetter(e.monitor));
    e.patience = early["patience"];
    e.minDelta = early["min_delta"];
    if (training["eval_every"] == 0) {
      v.fail("training.early_stopping", "needs evaluations, but training.eval_every is 0 (only the last epoch is "
             "evaluated). HINT: --set training.eval_every=1");
    }
    config.training.earlyStopping = e;
    training["early_stopping"] = early;
  } else {
    training["early_stopping"] = nullptr;
  }
  resolved["training"] = training;
  config.training.clipGradNorm = training["clip_grad_norm"];
  config.training.precision = training["precision"];
  config.training.keepBest = training["keep_best"];
  {
    const std::string by = training["keep_best_by"];
    if (!by.empty() && std::find(monitorNames().begin(), monitorNames().end(), by) == monitorNames().end()) {
      const std::string close = closestName(by, monitorNames());
      v.fail("training.keep_best_by", "expected one of {}, got {}{}", joinNames(monitorNames()), inQuotes(by),
             close.empty() ? "" : fmt::format("; did you mean {}?", inQuotes(close)));
    }
    const auto& early = config.training.earlyStopping;
    config.training.keepBestMonitor = !by.empty() ? by : early ? early->monitor : "test_loss";
    config.training.keepBestMaximize = early && early->monitor == config.training.keepBestMonitor
                                           ? early->maximize
                                           : largerIsBetter(config.training.keepBestMonitor);
  }
  config.training.epochs = training["epochs"];
  config.training.batchSize = training["batch_size"];
  config.training.seed = training["seed"].get<uint64_t>();
  config.training.saveEvery = training["save_every"];
  config.training.evalEvery = training["eval_every"];
  config.training.maxSteps = training["max_steps"];
  config.training.evalBatchSize = training["eval_batch_size"];
  config.training.logEvery = training["log_every"];
  config.training.accumulateGradBatches = training["accumulate_grad_batches"];
  config.training.threads = training["threads"];
  config.training.dropLast = training["drop_last"];
  config.training.join = training["join"];
  config.training.stopOnNonfiniteLoss = training["on_nonfinite_loss"] == "stop";
  config.training.checkpointOnSignal = training["checkpoint_on_signal"];
  config.training.tensorboard = training["tensorboard"];
  config.training.trace = training["trace"];
  config.training.traceStart = training["trace_start"];
  config.training.traceSteps = training["trace_steps"];

  Json distributedBody = root.contains("distributed") ? root["distributed"] : Json::object();
  Json commHookBody;
  if (distributedBody.is_object() && distributedBody.contains("comm_hook")) {
    commHookBody = distributedBody["comm_hook"];
    distributedBody.erase("comm_hook");
  }
  Json distributed = v.validateSection("distributed", distributedBody, distributedParamSpecs(), {"comm_hook"});
  if (auto hook = choosePlugin("distributed.comm_hook", PluginKind::CommHook, commHookBody, /*optional=*/true)) {
    config.distributed.commHook = hook->first;
    distributed["comm_hook"] = hook->second;
  }
  resolved["distributed"] = distributed;
  config.distributed.backend = distributed["backend"];
  config.distributed.device = distributed["device"];
  config.distributed.nprocPerNode = distributed["nproc_per_node"];
  config.distributed.nnodes = distributed["nnodes"];
  config.distributed.timeoutSeconds = distributed["timeout_s"];
  config.distributed.findUnusedParameters = distributed["find_unused_parameters"];
  config.distributed.bucketCapMb = distributed["bucket_cap_mb"];
  config.distributed.firstBucketCapMb = distributed["first_bucket_cap_mb"];
  config.distributed.strategy = distributed["strategy"];
  config.distributed.fsdpBackwardPrefetch = distributed["fsdp_backward_prefetch"];
  config.distributed.fsdpUnitMb = distributed["fsdp_unit_mb"];
  config.distributed.shardSize = distributed["shard_size"];
  {
    const std::string format = training["checkpoint_format"];
    const std::string& strategy = config.distributed.strategy;
    const bool sharding = strategy == "zero1" || strategy == "zero2" || strategy == "fsdp" || strategy == "hsdp";
    config.training.asyncCheckpoint = training["async_checkpoint"];
    // Asynchronous saving writes each rank's part: auto means sharded then.
    config.training.checkpointFormat =
        format != "auto" ? format : (sharding || config.training.asyncCheckpoint) ? "sharded" : "consolidated";
    if (config.training.asyncCheckpoint && config.training.checkpointFormat != "sharded") {
      v.fail("training.async_checkpoint", "needs sharded checkpoints (every rank writes its part in the "
             "background), not {}. HINT: --set training.checkpoint_format=sharded, or leave it \"auto\"",
             inQuotes(config.training.checkpointFormat));
    }
  }
  if (config.distributed.commHook && config.distributed.commHook->name != "allreduce" &&
      config.distributed.strategy != "ddp") {
    v.fail("distributed.comm_hook", "applies to distributed.strategy \"ddp\" only, not {}. HINT: remove the hook, or "
           "train with --set distributed.strategy=ddp (zero and fsdp reduce-scatter their gradients)",
           inQuotes(config.distributed.strategy));
  }

  for (const auto& o : overrides) {
    if (!o.used) {
      fail<ConfigError>("--set {}: nothing to set; the section is not in this experiment. HINT: choose the plugin "
                        "first, e.g. --set {}.name=NAME (ddp-run --list-plugins)",
                        o.path, o.path.substr(0, o.path.find('.')));
    }
  }
  config.resolved = resolved;
  return config;
}

PluginChoice parsePluginSection(const Json& body, const std::string& section, PluginKind kind,
                                const std::string& sourceName, PluginRegistry& registry) {
  try {
    std::vector<Override> none;
    Validator v(sourceName, "", none);
    if (!body.is_object()) v.fail(section, "expected an object with a \"name\", got {}", shown(body));
    if (!body.contains("name") || !body["name"].is_string()) {
      v.fail(section + ".name", "required: the {} to use (known: {})", pluginKindName(kind),
             joinNames(registry.names(kind)));
    }
    const std::string name = body["name"].get<std::string>();
    if (!registry.has(kind, name)) {
      v.fail(section + ".name", "unknown {} {} (known: {})", pluginKindName(kind), inQuotes(name),
             joinNames(registry.names(kind)));
    }
    Json params = v.validateSection(section, body, registry.get(kind, name).params, {"name"},
                                    fmt::format("{}.{}", pluginKindName(kind), name));
    params.erase("name");
    return PluginChoice{name, Params(params)};
  } catch (const ConfigError& e) {
    fail<ConfigError>("{}: {}", sourceName, e.what());
  }
}

ExperimentConfig loadExperimentConfig(const std::string& path, const std::vector<std::string>& overrides,
                                      PluginRegistry& registry) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    std::vector<std::string> experiments;
    for (const auto& entry : std::filesystem::directory_iterator(path, ec)) {
      if (entry.path().extension() == ".json") experiments.push_back(entry.path().filename().string());
    }
    std::sort(experiments.begin(), experiments.end());
    std::string hint = "pass one of its JSON files";
    if (!experiments.empty()) {
      hint += ":";
      for (const auto& name : experiments) hint += " " + name;
    }
    fail<ConfigError>("{}: is a folder, not an experiment file. HINT: {}", path, hint);
  }
  std::ifstream in(path);
  if (!in) {
    fail<ConfigError>(
        "{}: cannot open experiment file ({}). HINT: pass the path of a JSON file, e.g. experiments/wine_baseline.json",
        path, errnoText(errno));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::string dir = ".";
  auto slash = path.find_last_of('/');
  if (slash != std::string::npos) dir = path.substr(0, slash == 0 ? 1 : slash);
  return parseExperimentConfig(buffer.str(), path, absolutePath(dir), overrides, registry);
}

}  // namespace ddp
