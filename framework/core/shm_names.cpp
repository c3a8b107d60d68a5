#include "framework/core/shm_names.hpp"

#include <dirent.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>

#include <fmt/format.h>

#include "framework/core/system.hpp"

namespace ddp {
namespace {

constexpr const char* kPrefix = "ddp-";

// The pid field of "ddp-<kind>-<pid>-<random>", or -1.
pid_t creatorOf(const std::string& name) {
  if (name.rfind(kPrefix, 0) != 0) return -1;
  const size_t last = name.rfind('-');
  if (last == std::string::npos || last == 0) return -1;
  const size_t before = name.rfind('-', last - 1);
  if (before == std::string::npos || before + 1 >= last) return -1;
  const std::string field = name.substr(before + 1, last - before - 1);
  if (field.size() > 9 || !std::all_of(field.begin(), field.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return -1;
  }
  return static_cast<pid_t>(std::stol(field));
}

}  // namespace

std::string sharedMemoryName(const std::string& kind) {
  return fmt::format("/{}{}-{}-{}", kPrefix, kind, ::getpid(), randomHex(8));
}

std::vector<std::string> removeSharedMemoryOf(const std::vector<pid_t>& pids) {
  std::vector<std::string> removed;
  if (pids.empty()) return removed;
  DIR* dir = ::opendir("/dev/shm");
  if (!dir) return removed;
  std::vector<std::string> names;
  while (const dirent* entry = ::readdir(dir)) names.emplace_back(entry->d_name);
  ::closedir(dir);
  for (const std::string& name : names) {
    const pid_t creator = creatorOf(name);
    if (creator <= 0 || std::find(pids.begin(), pids.end(), creator) == pids.end()) continue;
    if (::shm_unlink(("/" + name).c_str()) == 0) removed.push_back("/dev/shm/" + name);
  }
  return removed;
}

}  // namespace ddp
