#include "framework/comm/backend_registry.hpp"

#include "framework/core/errors.hpp"
#include "framework/core/strings.hpp"

namespace ddp {

void BackendRegistry::add(const std::string& name, BackendFactory factory, BackendCheck check) {
  if (factories_.count(name) || unavailable_.count(name)) {
    fail<UsageError>("backend registry: backend '{}' is registered twice", name);
  }
  factories_[name] = std::move(factory);
  if (check) checks_[name] = std::move(check);
}

void BackendRegistry::addUnavailable(const std::string& name, const std::string& howToEnable) {
  if (factories_.count(name) || unavailable_.count(name)) {
    fail<UsageError>("backend registry: backend '{}' is registered twice", name);
  }
  unavailable_[name] = howToEnable;
}

std::vector<std::string> BackendRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& kv : factories_) out.push_back(kv.first);
  return out;
}

namespace {

std::optional<std::string> notRegistered(const BackendRegistry& registry, const std::string& name,
                                         const std::map<std::string, std::string>& unavailable) {
  if (registry.has(name)) return std::nullopt;
  auto off = unavailable.find(name);
  if (off != unavailable.end()) return fmt::format("backend '{}' is not in this build: {}", name, off->second);
  const std::string known = joinNames(registry.names());
  return fmt::format("unknown backend '{}'; known backends: {}", name, known.empty() ? "(none)" : known);
}

}  // namespace

std::optional<std::string> BackendRegistry::whyUnusable(const std::string& name) const {
  if (auto why = notRegistered(*this, name, unavailable_)) return why;
  auto check = checks_.find(name);
  return check == checks_.end() ? std::nullopt : check->second();
}

ProcessGroupPtr BackendRegistry::create(const std::string& name, std::shared_ptr<Store> store, int rank,
                                        int size, const ProcessGroupOptions& options) const {
  if (auto why = notRegistered(*this, name, unavailable_)) throw UsageError(*why);
  return factories_.at(name)(std::move(store), rank, size, options);
}

}  // namespace ddp
