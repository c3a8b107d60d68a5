#include "framework/experiment/plugin_registry.hpp"

#include <dlfcn.h>
#include <elf.h>
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iterator>
#include <sstream>
#include <type_traits>

#include "framework/core/errors.hpp"
#include "framework/core/strings.hpp"

namespace ddp {

namespace {

constexpr PluginKind kAllKinds[] = {PluginKind::Dataset, PluginKind::Model, PluginKind::Optimizer,
                                    PluginKind::Scheduler, PluginKind::Loss,  PluginKind::CommHook};

std::string namesOrNone(const std::vector<std::string>& names) {
  return names.empty() ? "(none)" : joinNames(names);
}

std::string formatDefault(const ParamSpec& spec) {
  if (spec.defaultValue.is_null()) return "(required)";
  return spec.defaultValue.dump();
}

std::string formatRange(const ParamSpec& spec) {
  if (!spec.choices.empty()) {
    std::string out;
    for (const auto& c : spec.choices) out += (out.empty() ? "" : "|") + c;
    return out;
  }
  if (spec.min && spec.max) {
    return fmt::format("{}{}, {}{}", spec.minExclusive ? "(" : "[", showNumber(*spec.min), showNumber(*spec.max),
                       spec.maxExclusive ? ")" : "]");
  }
  if (spec.min) return fmt::format("{} {}", spec.minExclusive ? ">" : ">=", showNumber(*spec.min));
  if (spec.max) return fmt::format("{} {}", spec.maxExclusive ? "<" : "<=", showNumber(*spec.max));
  return "";
}

// Left-aligned columns, each as wide as its widest cell, two spaces apart.
std::string formatTable(const std::vector<std::vector<std::string>>& rows, const std::string& indent) {
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    if (widths.size() < row.size()) widths.resize(row.size(), 0);
    for (size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line = indent;
    for (size_t c = 0; c < row.size(); ++c) {
      line += row[c];
      if (c + 1 < row.size()) line += std::string(widths[c] - row[c].size() + 2, ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

// "datasets", "models", ..., "losses".
std::string pluralKindName(PluginKind kind) {
  return kind == PluginKind::Loss ? "losses" : fmt::format("{}s", pluginKindName(kind));
}

size_t editDistance(const std::string& a, const std::string& b) {
  // Optimal string alignment: insertions, deletions, substitutions and
  // swaps of two adjacent letters, one edit each, so "mpl" is one edit from
  // "mlp" (and nearer than "gpt", two substitutions away). Three rows of
  // the table at a time: names are short.
  std::vector<size_t> twoBack(b.size() + 1), previous(b.size() + 1), row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) previous[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t substitute = previous[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      row[j] = std::min({previous[j] + 1, row[j - 1] + 1, substitute});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        row[j] = std::min(row[j], twoBack[j - 2] + 1);
      }
    }
    std::swap(twoBack, previous);
    std::swap(previous, row);
  }
  return previous[b.size()];
}

}  // namespace

const char* pluginKindName(PluginKind kind) {
  switch (kind) {
    case PluginKind::Dataset:
      return "dataset";
    case PluginKind::Model:
      return "model";
    case PluginKind::Optimizer:
      return "optimizer";
    case PluginKind::Scheduler:
      return "scheduler";
    case PluginKind::Loss:
      return "loss";
    case PluginKind::CommHook:
      return "comm_hook";
  }
  return "unknown";
}

std::optional<PluginKind> pluginKindFromName(const std::string& name) {
  for (PluginKind kind : kAllKinds) {
    if (name == pluginKindName(kind)) return kind;
  }
  return std::nullopt;
}

std::string closestName(const std::string& name, const std::vector<std::string>& candidates) {
  // A suggestion further away than a third of the name is noise, not a typo;
  // short names still get up to two edits ("mpl" -> "mlp").
  const size_t limit = std::max<size_t>(2, name.size() / 3);
  std::string best;
  size_t bestDistance = limit + 1;
  // "MLP" for "mlp": letters' case is no typo worth counting.
  const auto lower = [](std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  for (const auto& candidate : candidates) {
    if (lower(candidate) == lower(name)) return candidate;
  }
  for (const auto& candidate : candidates) {
    size_t d = editDistance(name, candidate);
    if (d < bestDistance) {
      bestDistance = d;
      best = candidate;
    }
  }
  return best;
}

// The factory alternatives are in PluginKind's order: kind() is the index.
static_assert(std::is_same_v<std::variant_alternative_t<static_cast<size_t>(PluginKind::Dataset), PluginFactory>,
                             DatasetFactory>);
static_assert(std::is_same_v<std::variant_alternative_t<static_cast<size_t>(PluginKind::Model), PluginFactory>,
                             ModelFactory>);
static_assert(std::is_same_v<std::variant_alternative_t<static_cast<size_t>(PluginKind::Optimizer), PluginFactory>,
                             OptimizerFactory>);
static_assert(std::is_same_v<std::variant_alternative_t<static_cast<size_t>(PluginKind::Scheduler), PluginFactory>,
                             SchedulerFactory>);
static_assert(std::is_same_v<std::variant_alternative_t<static_cast<size_t>(PluginKind::Loss), PluginFactory>,
                             LossFactory>);
static_assert(std::is_same_v<std::variant_alternative_t<static_cast<size_t>(PluginKind::CommHook), PluginFactory>,
                             CommHookFactory>);
static_assert(std::variant_size_v<PluginFactory> == std::size(kAllKinds));

namespace {

// The spec's factory as a `Factory`; a spec of another kind is a UsageError.
template <typename Factory>
const Factory& factoryOf(const PluginSpec& spec, PluginKind wanted) {
  const auto* factory = std::get_if<Factory>(&spec.factory);
  if (factory == nullptr) {
    fail<UsageError>("{} '{}' is not a {} plugin", pluginKindName(spec.kind()), spec.name, pluginKindName(wanted));
  }
  return *factory;
}

}  // namespace

DatasetSplits PluginSpec::dataset(const Params& values, const DatasetContext& context) const {
  return factoryOf<DatasetFactory>(*this, PluginKind::Dataset)(values, context);
}

ModelPtr PluginSpec::model(const Params& values, const ModelContext& context) const {
  return factoryOf<ModelFactory>(*this, PluginKind::Model)(values, context);
}

std::unique_ptr<torch::optim::Optimizer> PluginSpec::optimizer(std::vector<at::Tensor> parameters,
                                                               const Params& values) const {
  return factoryOf<OptimizerFactory>(*this, PluginKind::Optimizer)(std::move(parameters), values);
}

std::unique_ptr<LrScheduler> PluginSpec::scheduler(const Params& values) const {
  return factoryOf<SchedulerFactory>(*this, PluginKind::Scheduler)(values);
}

LossFn PluginSpec::loss(const Params& values) const { return factoryOf<LossFactory>(*this, PluginKind::Loss)(values); }
CommHookPtr PluginSpec::commHook(const Params& values, Milliseconds timeout) const {
  return factoryOf<CommHookFactory>(*this, PluginKind::CommHook)(values, timeout);
}

const char* taskName(Task task) {
  switch (task) {
    case Task::Classification: return "classification";
    case Task::Regression: return "regression";
    case Task::NextToken: return "next_token";
  }
  return "?";
}

DatasetSplits tensorSplits(at::Tensor trainFeatures, at::Tensor trainTargets, at::Tensor testFeatures,
                           at::Tensor testTargets, int64_t numClasses) {
  DatasetSplits splits;
  const auto sizes = trainFeatures.sizes();
  splits.sampleShape.assign(sizes.begin() + 1, sizes.end());
  splits.numFeatures = 1;
  for (int64_t d : splits.sampleShape) splits.numFeatures *= d;
  splits.numClasses = numClasses;
  splits.task = numClasses > 0 ? Task::Classification : Task::Regression;
  splits.train = std::make_shared<TensorDataset>(std::move(trainFeatures), std::move(trainTargets));
  splits.test = std::make_shared<TensorDataset>(std::move(testFeatures), std::move(testTargets));
  return splits;
}

ModelContext modelContextFor(const DatasetSplits& data) {
  ModelContext context;
  context.numFeatures = data.numFeatures;
  context.numClasses = data.numClasses;
  context.sampleShape = data.sampleShape;
  if (context.sampleShape.empty() && data.train && data.train->size() > 0) {
    const at::Tensor first = data.train->range(0, 1).inputs;
    context.sampleShape.assign(first.sizes().begin() + 1, first.sizes().end());
  }
  if (context.numFeatures == 0 && !context.sampleShape.empty()) {
    context.numFeatures = 1;
    for (int64_t d : context.sampleShape) context.numFeatures *= d;
  }
  context.vocabSize = data.vocabSize;
  return context;
}

void PluginRegistry::add(PluginSpec spec) {
  const char* kind = pluginKindName(spec.kind());
  if (spec.name.empty()) fail<UsageError>("plugin registry: a {} has an empty name", kind);
  auto& ofKind = plugins_[spec.kind()];
  if (ofKind.count(spec.name)) fail<UsageError>("plugin registry: {} '{}' is registered twice", kind, spec.name);
  // The variant fixes the kind; an empty std::function in it is still no factory.
  const bool hasFactory = std::visit([](const auto& factory) { return static_cast<bool>(factory); }, spec.factory);
  if (!hasFactory) fail<UsageError>("plugin registry: {} '{}' has no {} factory set", kind, spec.name, kind);
  if (spec.kind() == PluginKind::Scheduler &&
      std::none_of(spec.params.begin(), spec.params.end(), [](const ParamSpec& p) { return p.name == "warmup_steps"; })) {
    spec.params.push_back(Param("warmup_steps", ParamType::Int, 0,
                                "optimizer steps of linear warm-up: the lr of step s (0-based) is scaled by "
                                "min(1, (s + 1) / warmup_steps) (0: none)")
                              .atLeast(0));
  }
  if (spec.kind() == PluginKind::Model &&
      std::none_of(spec.params.begin(), spec.params.end(), [](const ParamSpec& p) { return p.name == "init_from"; })) {
    spec.params.push_back(Param("init_from", ParamType::String, "",
                                "start from these weights: a .safetensors file, or a .pt of Python's "
                                "torch.save(model.state_dict()) (names as python/ddp_models.py's; \"\": the "
                                "model's own initialisation). Read at a run's first start only")
                              .file());
  }
  std::string name = spec.name;
  ofKind.emplace(std::move(name), std::move(spec));
}

bool PluginRegistry::has(PluginKind kind, const std::string& name) const {
  auto it = plugins_.find(kind);
  return it != plugins_.end() && it->second.count(name) > 0;
}

const PluginSpec& PluginRegistry::get(PluginKind kind, const std::string& name) const {
  auto it = plugins_.find(kind);
  if (it != plugins_.end()) {
    auto found = it->second.find(name);
    if (found != it->second.end()) return found->second;
  }
  const auto known = names(kind);
  const std::string suggestion = closestName(name, known);
  fail<UsageError>("unknown {} '{}'{} known {}: {}", pluginKindName(kind), name,
                   suggestion.empty() ? ";" : fmt::format("; did you mean '{}'?", suggestion), pluralKindName(kind),
                   namesOrNone(known));
}

std::vector<std::string> PluginRegistry::names(PluginKind kind) const {
  std::vector<std::string> out;
  auto it = plugins_.find(kind);
  if (it == plugins_.end()) return out;
  for (const auto& kv : it->second) out.push_back(kv.first);
  return out;
}

std::string PluginRegistry::listing() const {
  std::string out;
  for (PluginKind kind : kAllKinds) {
    out += pluralKindName(kind) + ":\n";
    std::vector<std::vector<std::string>> rows;
    auto it = plugins_.find(kind);
    if (it != plugins_.end()) {
      for (const auto& kv : it->second) rows.push_back({kv.first, kv.second.doc});
    }
    if (rows.empty()) rows.push_back({"(none)"});
    out += formatTable(rows, "  ");
  }
  out += "Run --describe KIND.NAME (e.g. optimizer.adam) for a plugin's parameters.\n";
  return out;
}

std::string PluginRegistry::describe(const std::string& kindDotName) const {
  auto everything = [this] {
    std::vector<std::string> all;
    for (PluginKind kind : kAllKinds) {
      for (const auto& n : names(kind)) all.push_back(std::string(pluginKindName(kind)) + "." + n);
    }
    return all;
  };
  const auto dot = kindDotName.find('.');
  std::optional<PluginKind> kind;
  if (dot != std::string::npos) kind = pluginKindFromName(kindDotName.substr(0, dot));
  // A kind alone ("model"): the plugins of that kind, one line each.
  if (dot == std::string::npos) {
    if (const auto alone = pluginKindFromName(kindDotName)) {
      std::string out = fmt::format("{}: the {} plugins (ddp-run --describe {}.NAME for one's parameters)\n",
                                    kindDotName, kindDotName, kindDotName);
      std::vector<std::vector<std::string>> rows{{"name", "doc"}};
      for (const auto& n : names(*alone)) rows.push_back({n, get(*alone, n).doc});
      return out + formatTable(rows, "  ");
    }
  }
  if (kind && !has(*kind, kindDotName.substr(dot + 1))) {
    const std::string name = kindDotName.substr(dot + 1);
    const auto known = names(*kind);
    const std::string close = closestName(name, known);
    fail<UsageError>("cannot describe '{}': no {} plugin '{}'{}; known {}: {}. HINT: a plugin from a shared library "
                     "needs ddp-run --plugin-lib LIBRARY --describe {}",
                     kindDotName, pluginKindName(*kind), name,
                     close.empty() ? "" : fmt::format(" (did you mean '{}'?)", close), pluralKindName(*kind),
                     namesOrNone(known), kindDotName);
  }
  if (!kind) {
    const auto all = everything();
    // A bare name ("adam") is most likely meant as the plugin of that name.
    std::string suggestion;
    for (PluginKind k : kAllKinds) {
      if (dot == std::string::npos && has(k, kindDotName)) suggestion = fmt::format("{}.{}", pluginKindName(k), kindDotName);
    }
    if (suggestion.empty()) suggestion = closestName(kindDotName, all);
    fail<UsageError>("cannot describe '{}': expected KIND.NAME, or training, distributed, plugins; {}known plugins: {}", kindDotName,
                     suggestion.empty() ? "" : fmt::format("did you mean '{}'? ", suggestion), namesOrNone(all));
  }
  const PluginSpec& spec = get(*kind, kindDotName.substr(dot + 1));
  return fmt::format("{}.{}: {}\n", pluginKindName(spec.kind()), spec.name, spec.doc) + describeParams(spec.params);
}

std::string describeParams(const std::vector<ParamSpec>& specs,
                           const std::vector<std::vector<std::string>>& extraRows) {
  if (specs.empty() && extraRows.empty()) return "  (no parameters)\n";
  std::vector<std::vector<std::string>> rows{{"param", "type", "default", "range", "doc"}};
  for (const auto& p : specs) rows.push_back({p.name, paramTypeName(p.type), formatDefault(p), formatRange(p), p.doc});
  for (const auto& row : extraRows) rows.push_back(row);
  return formatTable(rows, "  ");
}

namespace {

// The bytes a 64-bit ELF file's headers say it holds (program headers, the
// segments they load, section headers), or 0 when `path` is not one (dlopen
// then says what it is). dlopen() maps a file cut short and the loader dies
// of SIGBUS touching the missing pages, so this is checked first.
uint64_t elfBytesNeeded(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  Elf64_Ehdr header{};
  if (!in.read(reinterpret_cast<char*>(&header), sizeof(header))) return 0;
  if (std::memcmp(header.e_ident, ELFMAG, SELFMAG) != 0 || header.e_ident[EI_CLASS] != ELFCLASS64) return 0;
  uint64_t needed = header.e_phoff + uint64_t{header.e_phnum} * header.e_phentsize;
  needed = std::max(needed, header.e_shoff + uint64_t{header.e_shnum} * header.e_shentsize);
  if (header.e_phentsize != sizeof(Elf64_Phdr)) return needed;
  in.seekg(static_cast<std::streamoff>(header.e_phoff));
  for (int i = 0; i < header.e_phnum; ++i) {
    Elf64_Phdr segment{};
    if (!in.read(reinterpret_cast<char*>(&segment), sizeof(segment))) break;  // cut short: `needed` says so
    if (segment.p_type == PT_LOAD) needed = std::max(needed, segment.p_offset + segment.p_filesz);
  }
  return needed;
}

}  // namespace

void loadPluginLibrary(const std::string& path, PluginRegistry& registry) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) fail<UsageError>("plugin library '{}': file not found", path);
  if (std::filesystem::is_regular_file(path, ec)) {
    const uint64_t size = std::filesystem::file_size(path, ec);
    const uint64_t needed = elfBytesNeeded(path);
    if (!ec && needed > size) {
      fail<UsageError>("plugin library '{}': the file is cut short: {} bytes, where its ELF headers describe {}. "
                       "HINT: build or copy the library again",
                       path, size, needed);
    }
  }
  // An absolute path, because dlopen() searches the library path, not the
  // current directory, for a name without a slash.
  const std::string absolute = std::filesystem::absolute(path, ec).string();
  // RTLD_NOW: an unresolved symbol fails here, naming the library, rather
  // than in the middle of training. RTLD_LOCAL: two plugins may define
  // helpers of the same name.
  void* handle = dlopen(absolute.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    const std::string reason = why ? why : "dlopen failed";
    fail<UsageError>("plugin library '{}': {}{}", path, reason,
                     reason.find("undefined symbol") != std::string::npos
                         ? ". HINT: build the program that loads plugins with ENABLE_EXPORTS (-rdynamic)"
                         : "");
  }
  // A library registers into a registry once: an experiment read twice in
  // one process (by the launcher, then by the rank) names it twice.
  if (registry.libraries_.count(handle) > 0) {
    dlclose(handle);  // drops the reference this dlopen() added
    return;
  }
  using RegisterFn = void (*)(PluginRegistry&);
  dlerror();
  auto* fn = reinterpret_cast<RegisterFn>(dlsym(handle, "ddp_register_plugins"));
  if (fn == nullptr) {
    dlclose(handle);
    fail<UsageError>(
        "plugin library '{}' has no ddp_register_plugins symbol. HINT: export extern \"C\" void "
        "ddp_register_plugins(ddp::PluginRegistry&)",
        path);
  }
  // The plugin interface it was compiled against must be this one: a
  // PluginSpec or factory of another layout would be misread, not refused.
  using VersionFn = int (*)();
  auto* versionFn = reinterpret_cast<VersionFn>(dlsym(handle, "ddp_plugin_api_version"));
  if (versionFn == nullptr) {
    dlclose(handle);
    fail<UsageError>(
        "plugin library '{}' has no plugin API version (no ddp_plugin_api_version symbol); this ddp has plugin API "
        "version {}. HINT: rebuild it against this ddp, with DDP_EXPORT_PLUGIN_API_VERSION(); in one of its sources",
        path, DDP_PLUGIN_API_VERSION);
  }
  const int version = versionFn();
  if (version != DDP_PLUGIN_API_VERSION) {
    dlclose(handle);
    fail<UsageError>(
        "plugin library '{}' was built for plugin API version {}; this ddp has plugin API version {}. HINT: "
        "rebuild it against this ddp's headers",
        path, version, DDP_PLUGIN_API_VERSION);
  }
  // The library stays loaded for the life of the process: the registry now
  // holds factories whose code lives in it.
  fn(registry);
  registry.libraries_.insert(handle);
}

}  // namespace ddp
