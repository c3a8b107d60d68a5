// The `digits` dataset: 1,797 handwritten digits as [1, 8, 8] images
// (data/digits.csv, see data/README.md), 10 classes.
//
// Contract
// - The file: 1,797 lines (any number is accepted) of 64 pixels 0..16 and
//   the digit 0..9; a line with another column count, a value that is not
//   an integer in range, or a missing class is a UsageError naming
//   file:line:column.
// - Inputs float32 [N, 1, 8, 8] = pixel / 16, in [0, 1]; targets int64 [N].
// - Split: test_fraction of the images by the seeded permutation of
//   plugins/datasets/files.hpp, so every rank holds the same split.
#pragma once

#include "framework/experiment/plugin_registry.hpp"

namespace ddp::plugins {

DatasetSplits loadDigits(const Params& params, const DatasetContext& context);

}  // namespace ddp::plugins
