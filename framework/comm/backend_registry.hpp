// BackendRegistry: ProcessGroup implementations by name ("gloo", "nccl"),
// chosen at run time.
//
// Backends are registered explicitly (backends/builtin.hpp registers the
// ones this build compiled; no static initializers that a linker could
// drop). A name registered twice is an
// error. create() with an unknown name throws UsageError listing the known
// names; a backend that this build left out says how to enable it.
// whyUnusable() answers the same questions, and the backend's own (NCCL:
// are there GPUs?), without creating a group: a launcher asks it before it
// starts any rank.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "framework/comm/process_group.hpp"
#include "framework/store/store.hpp"

namespace ddp {

using BackendFactory = std::function<ProcessGroupPtr(std::shared_ptr<Store> store, int rank, int size,
                                                     const ProcessGroupOptions& options)>;
// Why this process cannot use the backend, or nullopt when it can.
using BackendCheck = std::function<std::optional<std::string>()>;

class BackendRegistry {
 public:
  void add(const std::string& name, BackendFactory factory, BackendCheck check = {});
  // Records a backend this build does not have, and why, for the error.
  void addUnavailable(const std::string& name, const std::string& howToEnable);

  bool has(const std::string& name) const { return factories_.count(name) > 0; }
  // A known backend that this build left out (addUnavailable).
  bool compiledOut(const std::string& name) const { return unavailable_.count(name) > 0; }
  std::vector<std::string> names() const;
  // The error create() would throw before reaching the backend, or the
  // backend's own check's; nullopt when the backend can be used here.
  std::optional<std::string> whyUnusable(const std::string& name) const;
  ProcessGroupPtr create(const std::string& name, std::shared_ptr<Store> store, int rank, int size,
                         const ProcessGroupOptions& options = {}) const;

 private:
  std::map<std::string, BackendFactory> factories_;
  std::map<std::string, BackendCheck> checks_;
  std::map<std::string, std::string> unavailable_;
};

}  // namespace ddp
