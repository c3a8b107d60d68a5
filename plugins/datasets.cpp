// Datasets: the vendored UCI Wine table, any numeric CSV, synthetic Gaussian
// blobs, and NumPy .npy files (datasets/npy.hpp). All split train/test with
// the same seeded shuffle, so every rank (and every machine) that uses the
// same seed sees the same split.

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include "framework/core/data_dirs.hpp"
#include "framework/core/system.hpp"
#include "plugins/common.hpp"
#include "plugins/datasets/digits.hpp"
#include "plugins/datasets/files.hpp"
#include "plugins/datasets/npy.hpp"
#include "plugins/datasets/text.hpp"

namespace ddp::plugins {

namespace {

// ---- seeded randomness, identical on every platform -----------------------------
// std::shuffle and std::*_distribution are implementation-defined; the
// engine mt19937_64 is not, so everything random is derived from it by hand.

// Uniform in (0, 1], from the top 53 bits.
double uniformOpenClosed(std::mt19937_64& rng) { return static_cast<double>((rng() >> 11) + 1) * 0x1.0p-53; }

double standardNormal(std::mt19937_64& rng) {
  // Box-Muller, one value per call: simple and stateless.
  const double radius = std::sqrt(-2.0 * std::log(uniformOpenClosed(rng)));
  return radius * std::cos(2.0 * M_PI * uniformOpenClosed(rng));
}

// ---- splitting and scaling --------------------------------------------------------

// features: [N, F] float64; targets: [N] int64 (classification) or float64.
DatasetSplits splitAndScale(const at::Tensor& features, const at::Tensor& targets, int64_t numClasses,
                            double testFraction, bool standardize, uint64_t seed) {
  const int64_t n = features.size(0);
  const int64_t numTest = testRowCount(n, testFraction);
  const auto order = seededPermutation(n, seed);
  auto index = torch::tensor(order, torch::kInt64);
  auto testIndex = index.slice(0, 0, numTest);
  auto trainIndex = index.slice(0, numTest, n);

  at::Tensor train = features.index_select(0, trainIndex);
  at::Tensor test = features.index_select(0, testIndex);
  if (standardize) {
    // Fitted on the training rows only: the test rows must not leak into
    // the model through the scaling.
    auto mean = train.mean(0);
    auto stddev = (train - mean).pow(2).mean(0).sqrt();  // population std, as scikit-learn's scaler
    // A constant column has a std of 0, or of rounding noise; leave it unscaled.
    auto tiny = 1e-12 * torch::clamp_min(mean.abs(), 1.0);
    stddev = torch::where(stddev > tiny, stddev, torch::ones_like(stddev));
    train = (train - mean) / stddev;
    test = (test - mean) / stddev;
  }

  const auto targetType = numClasses > 0 ? torch::kInt64 : torch::kFloat32;
  return tensorSplits(train.to(torch::kFloat32).contiguous(),
                      targets.index_select(0, trainIndex).to(targetType).contiguous(),
                      test.to(torch::kFloat32).contiguous(),
                      targets.index_select(0, testIndex).to(targetType).contiguous(), numClasses);
}

// ---- reading files ----------------------------------------------------------------

struct CsvRow {
  int64_t line = 0;
  std::vector<std::string> fields;
};

std::string trim(const std::string& s) {
  size_t begin = s.find_first_not_of(" \t\r");
  if (begin == std::string::npos) return "";
  size_t end = s.find_last_not_of(" \t\r");
  return s.substr(begin, end - begin + 1);
}

// Non-blank lines split on commas, with their 1-based line numbers.
std::vector<CsvRow> readCsvRows(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail<UsageError>("dataset file '{}' cannot be opened: {}", path, errnoText(errno));
  std::vector<CsvRow> rows;
  std::string line;
  int64_t lineNumber = 0;
  while (std::getline(in, line)) {
    ++lineNumber;
    if (trim(line).empty()) continue;
    CsvRow row;
    row.line = lineNumber;
    size_t start = 0;
    for (;;) {
      size_t comma = line.find(',', start);
      row.fields.push_back(trim(line.substr(start, comma == std::string::npos ? std::string::npos : comma - start)));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    rows.push_back(std::move(row));
  }
  if (rows.empty()) fail<UsageError>("{}: empty file", path);
  return rows;
}

// column is 1-based, as a spreadsheet shows it.
double parseNumber(const std::string& path, const CsvRow& row, size_t column) {
  const std::string& text = row.fields[column - 1];
  const std::string where = fmt::format("{}:{}: column {}", path, row.line, column);
  if (text.empty()) fail<UsageError>("{}: empty value", where);
  // from_chars: locale-independent, unlike strtod. It rejects a leading '+'.
  const char* begin = text.data() + (text[0] == '+' ? 1 : 0);
  const char* end = text.data() + text.size();
  double value = 0;
  auto [next, ec] = std::from_chars(begin, end, value);
  if (ec == std::errc::result_out_of_range) fail<UsageError>("{}: '{}' is out of range", where, text);
  if (ec != std::errc() || next != end) fail<UsageError>("{}: '{}' is not a number", where, text);
  if (!std::isfinite(value)) fail<UsageError>("{}: '{}' is not a finite number", where, text);
  return value;
}

void checkColumns(const std::string& path, const CsvRow& row, size_t expected) {
  if (row.fields.size() != expected) {
    fail<UsageError>("{}:{}: expected {} columns, found {}", path, row.line, expected, row.fields.size());
  }
}

int64_t classIndex(const std::string& path, const CsvRow& row, double value) {
  if (value < 0 || value != std::floor(value) || value > 1e9) {
    fail<UsageError>(
        "{}:{}: target {} is not a class index (a non-negative integer). HINT: set \"task\": \"regression\" for "
        "continuous targets",
        path, row.line, showNumber(value));
  }
  return static_cast<int64_t>(value);
}

// Class labels must be 0..C-1, each with a row, and at least two of them: a
// stray 7 among 0-2 would make 8 classes (a model with 8 outputs, 5 of them
// never right), and one class leaves nothing to learn. An error, not a
// warning: training would run and report numbers that mean nothing.
void checkClassLabels(const std::string& path, const std::vector<double>& targets) {
  std::set<int64_t> seen;
  for (double t : targets) seen.insert(static_cast<int64_t>(t));
  const int64_t implied = *seen.rbegin() + 1;
  std::vector<int64_t> shown(seen.begin(), seen.end());
  if (shown.size() > 12) shown.resize(12);
  const std::string labels = joinNames(shown) + (seen.size() > shown.size() ? ", ..." : "");
  if (seen.size() < 2) {
    fail<UsageError>(
        "{}: every row has class {}; a classifier needs at least 2 classes. HINT: check dataset.target_column, or set "
        "\"task\": \"regression\"",
        path, labels);
  }
  if (static_cast<int64_t>(seen.size()) != implied) {
    std::vector<int64_t> missing;
    for (int64_t c = 0; c < implied && missing.size() < 12; ++c) {
      if (!seen.count(c)) missing.push_back(c);
    }
    fail<UsageError>(
        "{}: class labels must be 0..C-1 with a row for each; found {} ({} classes implied, no row for {}{}). HINT: "
        "renumber the labels 0..{}, or set \"task\": \"regression\"",
        path, labels, implied, joinNames(missing), implied - static_cast<int64_t>(seen.size()) > 12 ? ", ..." : "",
        seen.size() - 1);
  }
}

// ---- wine -------------------------------------------------------------------------

// scikit-learn's wine_data.csv: a first line "178,13,class_0,class_1,class_2"
// (rows, features, class names), then 13 features and the class per row.
DatasetSplits loadWine(const Params& params, const DatasetContext& context) {
  const std::string path = resolveDataPath("path", params.getString("path"), context);
  const auto rows = readCsvRows(path);
  const CsvRow& head = rows[0];
  if (head.fields.size() < 3) {
    fail<UsageError>("{}:{}: expected the scikit-learn header 'rows,features,class names...'", path, head.line);
  }
  const auto numRows = static_cast<int64_t>(parseNumber(path, head, 1));
  const auto numFeatures = static_cast<int64_t>(parseNumber(path, head, 2));
  const auto numClasses = static_cast<int64_t>(head.fields.size()) - 2;
  if (numRows < 1 || numFeatures < 1) {
    fail<UsageError>("{}:{}: the header gives no rows or no features", path, head.line);
  }
  if (static_cast<int64_t>(rows.size()) - 1 != numRows) {
    fail<UsageError>("{}: the header says {} rows, the file has {}", path, numRows, rows.size() - 1);
  }
  std::vector<double> features;
  std::vector<int64_t> targets;
  features.reserve(static_cast<size_t>(numRows * numFeatures));
  for (size_t r = 1; r < rows.size(); ++r) {
    checkColumns(path, rows[r], static_cast<size_t>(numFeatures) + 1);
    for (int64_t c = 1; c <= numFeatures; ++c) features.push_back(parseNumber(path, rows[r], static_cast<size_t>(c)));
    int64_t label = classIndex(path, rows[r], parseNumber(path, rows[r], static_cast<size_t>(numFeatures) + 1));
    if (label >= numClasses) {
      fail<UsageError>("{}:{}: class {} but the header names {} classes", path, rows[r].line, label, numClasses);
    }
    targets.push_back(label);
  }
  auto x = torch::tensor(features, torch::kFloat64).view({numRows, numFeatures});
  auto y = torch::tensor(targets, torch::kInt64);
  return splitAndScale(x, y, numClasses, params.getDouble("test_fraction"), params.getBool("standardize"),
                       context.seed);
}

// ---- csv --------------------------------------------------------------------------

DatasetSplits loadCsv(const Params& params, const DatasetContext& context) {
  const std::string path = resolveDataPath("path", params.getString("path"), context);
  const bool classification = params.getString("task") == "classification";
  const auto rows = readCsvRows(path);
  const bool header = params.getBool("header");
  const size_t firstData = header ? 1 : 0;
  if (rows.size() <= firstData) fail<UsageError>("{}: no data rows after the header", path);
  const size_t numColumns = rows[0].fields.size();
  if (numColumns < 2) {
    fail<UsageError>("{}:{}: expected at least 2 columns (features and a target), found {}", path, rows[0].line,
                     numColumns);
  }
  int64_t target = params.getInt("target_column");
  const auto signedColumns = static_cast<int64_t>(numColumns);
  // The target by its name in the header, as pandas users write it.
  if (const std::string name = params.getString("target"); !name.empty()) {
    if (!header) paramError(kDataset, "target", "names a column, but header is false: there are no names");
    const auto& names = rows[0].fields;
    const auto it = std::find(names.begin(), names.end(), name);
    if (it == names.end()) {
      const std::string close = closestName(name, names);
      paramError(kDataset, "target", "no column \"{}\" in {}'s header{} (columns: {})", name, path,
                 close.empty() ? "" : fmt::format("; did you mean \"{}\"?", close), joinNames(names));
    }
    target = static_cast<int64_t>(it - names.begin());
  }
  if (target < -signedColumns || target >= signedColumns) {
    paramError(kDataset, "target_column", "{} is out of range for {} columns (0..{}, or negative from the end)", target,
               numColumns, numColumns - 1);
  }
  if (target < 0) target += signedColumns;

  const auto numRows = static_cast<int64_t>(rows.size() - firstData);
  const auto numFeatures = signedColumns - 1;
  std::vector<double> features;
  std::vector<double> targets;
  features.reserve(static_cast<size_t>(numRows * numFeatures));
  int64_t numClasses = 0;
  for (size_t r = firstData; r < rows.size(); ++r) {
    checkColumns(path, rows[r], numColumns);
    for (size_t c = 0; c < numColumns; ++c) {
      double value = parseNumber(path, rows[r], c + 1);
      if (static_cast<int64_t>(c) != target) {
        features.push_back(value);
      } else {
        if (classification) numClasses = std::max(numClasses, classIndex(path, rows[r], value) + 1);
        targets.push_back(value);
      }
    }
  }
  if (classification) checkClassLabels(path, targets);
  auto x = torch::tensor(features, torch::kFloat64).view({numRows, numFeatures});
  auto y = torch::tensor(targets, torch::kFloat64);
  if (classification) y = y.to(torch::kInt64);
  return splitAndScale(x, y, numClasses, params.getDouble("test_fraction"), params.getBool("standardize"),
                       context.seed);
}

// ---- synthetic --------------------------------------------------------------------

// Gaussian blobs: class c's rows scatter with std `noise` around a centroid
// drawn from N(0, 1) per feature. Balanced classes (row i has class i % C).
DatasetSplits makeSynthetic(const Params& params, const DatasetContext& context) {
  const int64_t samples = params.getInt("samples");
  const int64_t numFeatures = params.getInt("features");
  const int64_t numClasses = params.getInt("classes");
  const double noise = params.getDouble("noise");
  if (samples < numClasses) {
    paramError(kDataset, "samples", "{} is fewer than the {} classes", samples, numClasses);
  }
  // A stream of its own, so that the data does not correlate with the split.
  std::mt19937_64 rng(context.seed ^ 0x9E3779B97F4A7C15ULL);
  std::vector<double> centroids(static_cast<size_t>(numClasses * numFeatures));
  for (auto& v : centroids) v = standardNormal(rng);
  std::vector<double> features(static_cast<size_t>(samples * numFeatures));
  std::vector<int64_t> targets(static_cast<size_t>(samples));
  for (int64_t i = 0; i < samples; ++i) {
    const int64_t c = i % numClasses;
    targets[static_cast<size_t>(i)] = c;
    for (int64_t f = 0; f < numFeatures; ++f) {
      features[static_cast<size_t>(i * numFeatures + f)] =
          centroids[static_cast<size_t>(c * numFeatures + f)] + noise * standardNormal(rng);
    }
  }
  auto x = torch::tensor(features, torch::kFloat64).view({samples, numFeatures});
  auto y = torch::tensor(targets, torch::kInt64);
  return splitAndScale(x, y, numClasses, params.getDouble("test_fraction"), /*standardize=*/false, context.seed);
}

ParamSpec standardizeParam() {
  return Param("standardize", ParamType::Bool, true,
               "scale each feature to mean 0, std 1 (fitted on the training rows)");
}

}  // namespace

void registerDatasets(PluginRegistry& registry) {
  registry.add({"wine",
                "UCI Wine recognition: 178 wines, 13 chemical features, 3 cultivars (data/wine.csv)",
                {
                    Param("path", ParamType::String, "data/wine.csv",
                          "the scikit-learn wine_data.csv (a relative path: the experiment's folder, the working folder, "
                          "then the data folders)")
                        .file(),
                    testFractionParam(),
                    standardizeParam(),
                },
                loadWine});
  registry.add({"csv",
                "a numeric table from a CSV file: one target column, the others features",
                {
                    Param("path", ParamType::String, nullptr,
                          "the CSV file (a relative path: the experiment's folder, the working folder, then the data "
                          "folders)")
                        .file(),
                    Param("target_column", ParamType::Int, -1,
                          "0-based column of the target; negative counts from the end"),
                    Param("target", ParamType::String, "",
                          "the target column by its name in the header (instead of target_column)"),
                    Param("header", ParamType::Bool, true, "the first line names the columns"),
                    standardizeParam(),
                    Param("task", ParamType::String, "classification",
                          "classification: targets are class indices 0..C-1; regression: real targets")
                        .oneOf({"classification", "regression"}),
                    testFractionParam(),
                },
                loadCsv});
  registry.add({"synthetic",
                "Gaussian blobs around random class centroids, generated from the seed",
                {
                    Param("samples", ParamType::Int, 1024, "rows in all (train + test)").atLeast(2),
                    Param("features", ParamType::Int, 16, "features per row").atLeast(1),
                    Param("classes", ParamType::Int, 4, "number of classes").atLeast(2),
                    Param("noise", ParamType::Float, 0.1,
                          "std of the scatter around each centroid (centroids are N(0, 1))")
                        .atLeast(0),
                    testFractionParam(),
                },
                makeSynthetic});
  registry.add({"digits",
                "UCI handwritten digits: 1,797 images of 8x8 pixels as [1, 8, 8], 10 classes (data/digits.csv)",
                {
                    Param("path", ParamType::String, "data/digits.csv",
                          "64 pixels 0..16 and the digit per line (a relative path: the experiment's folder, the "
                          "working folder, then the data folders)")
                        .file(),
                    testFractionParam(),
                },
                loadDigits});
  registry.add({"text",
                "next-token prediction over a plain-text file: bytes as tokens, windows of block_size, split by "
                "position",
                {
                    Param("path", ParamType::String, nullptr,
                          "the text file, e.g. /usr/share/games/fortunes/computers (Debian's fortunes package)")
                        .file(),
                    Param("block_size", ParamType::Int, 64, "tokens per window (the model's context)").atLeast(1),
                    Param("stride", ParamType::Int, 0, "tokens between window starts (0: block_size)").atLeast(0),
                    Param("val_fraction", ParamType::Float, 0.1, "the last part of the text, held out")
                        .above(0)
                        .below(1),
                    Param("max_bytes", ParamType::Int, 0, "read at most this many bytes of the file (0: all)")
                        .atLeast(0),
                },
                loadText});
  registry.add(npyDataset());
}

}  // namespace ddp::plugins
