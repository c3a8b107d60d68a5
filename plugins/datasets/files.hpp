// What the built-in datasets share: finding a data file, the seeded
// shuffle that every rank (and every machine) draws the same way, and the
// size of a held-out test split.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "framework/experiment/plugin_registry.hpp"

namespace ddp::plugins {

// A relative `path` (dataset parameter `param`) is looked up next to the
// config, then in the current directory, then where data/ ships (the source
// tree, an installed share/ddp: framework/core/data_dirs.hpp), so that
// experiments/*.json work from any directory. UsageError naming `param` and
// every place tried when there is no such file.
std::string resolveDataPath(const std::string& param, const std::string& path, const DatasetContext& context);

// A permutation of 0..n-1 from mt19937_64(seed) by Fisher-Yates with
// unbiased draws: identical on every platform (std::shuffle is not).
std::vector<int64_t> seededPermutation(int64_t n, uint64_t seed);

// The `test_fraction` parameter: the fraction of rows held out for testing.
ParamSpec testFractionParam();

// Rows held out of n for `testFraction`: round(n * testFraction). UsageError
// (dataset.test_fraction) for a fraction of 1 or more, or one that leaves
// no test row or no training row. The test rows are the first of
// seededPermutation(n, seed), the training rows the rest.
int64_t testRowCount(int64_t n, double testFraction);

}  // namespace ddp::plugins
