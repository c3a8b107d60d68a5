// The `npy` dataset: features and labels from NumPy .npy files
// (npy_file.hpp), the way users bring their own data (MNIST, CIFAR,
// embeddings) after numpy.save.
//
// Contract
// - `features`: an .npy of shape (N, ...): row i is sample i, and the shape
//   after N is the sample shape ((N, 1, 28, 28) gives images, (N, D) a
//   table). `labels`: shape (N,), integer class indices for classification
//   (0..num_classes-1; num_classes 0 means the largest label + 1), any
//   supported dtype for regression.
// - The test split is `test_features`/`test_labels` when both are given,
//   otherwise `test_fraction` of the rows, chosen by the seeded permutation
//   the other built-in datasets use (files.hpp), so every rank splits alike.
// - Nothing is copied at load: both files stay memory-mapped, and a split
//   holds its list of row numbers into them. get() gathers the rows of a
//   batch and converts them: features to float32, then multiplied by
//   `scale` (e.g. 1/255 for uint8 pixels); labels to int64 (classification)
//   or float32 (regression).
// - The labels are checked once, at load, in one pass over the mapped file;
//   every mistake (shapes that disagree, a label out of range, float labels
//   for classification, fewer than 2 classes, no samples) is one UsageError
//   line naming the file(s), with a HINT where there is a fix.
#pragma once

#include "framework/experiment/plugin_registry.hpp"

namespace ddp::plugins {

// The plugin: name "npy", its parameters and its factory.
PluginSpec npyDataset();

}  // namespace ddp::plugins
