#include "framework/backend_registry.hpp"

#include "framework/errors.hpp"

namespace ddp {

void BackendRegistry::add(const std::string& name, BackendFactory factory) {
  if (factories_.count(name) || unavailable_.count(name)) {
    throw UsageError("backend registry: backend '" + name + "' is registered twice");
  }
  factories_[name] = std::move(factory);
}

void BackendRegistry::addUnavailable(const std::string& name, const std::string& howToEnable) {
  if (factories_.count(name) || unavailable_.count(name)) {
    throw UsageError("backend registry: backend '" + name + "' is registered twice");
  }
  unavailable_[name] = howToEnable;
}

std::vector<std::string> BackendRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& kv : factories_) out.push_back(kv.first);
  return out;
}

ProcessGroupPtr BackendRegistry::create(const std::string& name, std::shared_ptr<Store> store, int rank,
                                        int size, const ProcessGroupOptions& options) const {
  auto it = factories_.find(name);
  if (it != factories_.end()) return it->second(std::move(store), rank, size, options);
  auto off = unavailable_.find(name);
  if (off != unavailable_.end()) {
    throw UsageError("backend '" + name + "' is not in this build: " + off->second);
  }
  std::string known;
  for (const auto& n : names()) known += (known.empty() ? "" : ", ") + n;
  throw UsageError("unknown backend '" + name + "'; known backends: " + (known.empty() ? "(none)" : known));
}

}  // namespace ddp
