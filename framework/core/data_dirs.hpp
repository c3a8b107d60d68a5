// Where the files that ship with ddp (data/wine.csv, experiments/*.json)
// are looked for when a config names them by a relative path.
//
// Contract
// - dataSearchDirs() lists, in this order and each only if it is an
//   existing directory: $DDP_DATA_DIR; the installed data folder next to the
//   running program (<prefix>/share/ddp for <prefix>/bin/ddp-run); the
//   source tree this build came from (DDP_SOURCE_DIR, where data/ lives);
//   the data folder of the install prefix the build was configured with.
//   Callers look in the config's folder and the working folder first.
// - A build used from its source tree behaves as before (the source tree is
//   found); an installed ddp finds its data under <prefix>/share/ddp even
//   when the source tree is gone, or wherever $DDP_DATA_DIR points.
// - Header-only: both ddp_train and ddp_plugins resolve paths with it.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "ddp/config.hpp"
#include "ddp/install_dirs.hpp"

namespace ddp {

inline std::vector<std::string> dataSearchDirs() {
  namespace fs = std::filesystem;
  std::vector<fs::path> candidates;
  if (const char* env = std::getenv("DDP_DATA_DIR"); env && *env) candidates.emplace_back(env);
  char exe[4096];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) candidates.push_back(fs::path(std::string(exe, static_cast<size_t>(n))).parent_path() / DDP_DATA_DIR_FROM_BIN);
  candidates.emplace_back(DDP_SOURCE_DIR);
  candidates.emplace_back(DDP_INSTALL_DATA_DIR);
  std::vector<std::string> dirs;
  for (const fs::path& candidate : candidates) {
    std::error_code ec;
    if (!fs::is_directory(candidate, ec)) continue;
    const std::string dir = candidate.lexically_normal().string();
    bool seen = false;
    for (const std::string& d : dirs) seen = seen || d == dir;
    if (!seen) dirs.push_back(dir);
  }
  return dirs;
}

}  // namespace ddp
