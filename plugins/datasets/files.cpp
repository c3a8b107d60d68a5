#include "plugins/datasets/files.hpp"

#include <cmath>
#include <filesystem>
#include <random>

#include "framework/core/data_dirs.hpp"
#include "plugins/common.hpp"

namespace ddp::plugins {

namespace {

// Uniform in [0, bound) without modulo bias: reject the short last block.
uint64_t uniformBelow(std::mt19937_64& rng, uint64_t bound) {
  const uint64_t threshold = (0 - bound) % bound;  // 2^64 mod bound
  for (;;) {
    uint64_t r = rng();
    if (r >= threshold) return r % bound;
  }
}

}  // namespace

std::string resolveDataPath(const std::string& param, const std::string& path, const DatasetContext& context) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::path(path).is_absolute()) {
    if (fs::exists(path, ec)) return path;
    paramError(PluginKind::Dataset, param, "file '{}' not found", path);
  }
  std::vector<fs::path> candidates;
  if (!context.configDir.empty()) candidates.push_back(fs::path(context.configDir) / path);
  candidates.push_back(fs::path(path));
  for (const std::string& dir : dataSearchDirs()) candidates.push_back(fs::path(dir) / path);
  std::string tried;
  for (const auto& candidate : candidates) {
    if (fs::is_regular_file(candidate, ec)) return candidate.string();
    tried += (tried.empty() ? "" : ", ") + fs::absolute(candidate, ec).string();
  }
  paramError(PluginKind::Dataset, param, "file '{}' not found (looked for {})", path, tried);
}

std::vector<int64_t> seededPermutation(int64_t n, uint64_t seed) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
  std::mt19937_64 rng(seed);
  for (int64_t i = n - 1; i > 0; --i) {
    auto j = static_cast<int64_t>(uniformBelow(rng, static_cast<uint64_t>(i) + 1));
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
  }
  return order;
}

ParamSpec testFractionParam() {
  return Param("test_fraction", ParamType::Float, 0.2, "fraction of rows held out for testing").above(0).below(1);
}

int64_t testRowCount(int64_t n, double testFraction) {
  requireBelow(PluginKind::Dataset, "test_fraction", testFraction, 1.0);
  const auto numTest = static_cast<int64_t>(std::llround(static_cast<double>(n) * testFraction));
  if (numTest < 1 || numTest > n - 1) {
    paramError(PluginKind::Dataset, "test_fraction", "{} of {} rows leaves {}", showNumber(testFraction), n,
               numTest < 1 ? "no test rows" : "no training rows");
  }
  return numTest;
}

}  // namespace ddp::plugins
