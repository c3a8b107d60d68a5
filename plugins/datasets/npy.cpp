#include "plugins/datasets/npy.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "plugins/common.hpp"
#include "plugins/datasets/files.hpp"
#include "plugins/datasets/npy_file.hpp"

namespace ddp::plugins {

namespace {

// Rows of two mapped arrays, converted a batch at a time.
class NpyDataset final : public Dataset {
 public:
  // rows: the file rows of this split, in order; null for every row.
  NpyDataset(at::Tensor features, at::Tensor labels, std::shared_ptr<const std::vector<int64_t>> rows, double scale,
             at::ScalarType targetType)
      : features_(std::move(features)),
        labels_(std::move(labels)),
        rows_(std::move(rows)),
        scale_(scale),
        targetType_(targetType) {}

  int64_t size() const override { return rows_ ? static_cast<int64_t>(rows_->size()) : features_.size(0); }

  Batch get(c10::ArrayRef<int64_t> indices) const override {
    const int64_t n = size();
    std::vector<int64_t> fileRows(indices.begin(), indices.end());
    for (int64_t& row : fileRows) {
      TORCH_CHECK(row >= 0 && row < n, "sample index ", row, " out of range for ", n, " samples");
      if (rows_) row = (*rows_)[static_cast<size_t>(row)];
    }
    at::Tensor inputs = gatherRows(features_, fileRows);
    if (inputs.scalar_type() != at::kFloat) inputs = inputs.to(at::kFloat);
    if (scale_ != 1.0) inputs.mul_(scale_);
    at::Tensor targets = gatherRows(labels_, fileRows);
    if (targets.scalar_type() != targetType_) targets = targets.to(targetType_);
    return {std::move(inputs), std::move(targets)};
  }

 private:
  at::Tensor features_;  // mapped, the file's dtype
  at::Tensor labels_;    // mapped, the file's dtype
  std::shared_ptr<const std::vector<int64_t>> rows_;
  double scale_;
  at::ScalarType targetType_;
};

bool isIntegral(at::ScalarType t) { return t == at::kByte || t == at::kInt || t == at::kLong; }

// Throws UsageError naming the first NaN or infinity of a floating array
// (one pass over the mapped file), with its sample index.
void checkFinite(const NpyArray& array, const std::string& path, const char* what) {
  const at::Tensor& t = array.data;
  if (!at::isFloatingType(t.scalar_type()) || t.numel() == 0) return;
  // In chunks, so that a file of many GiB needs no mask as large.
  constexpr int64_t kChunk = int64_t{1} << 24;
  const at::Tensor all = t.reshape({-1});
  int64_t flat = -1;
  for (int64_t start = 0; start < all.numel() && flat < 0; start += kChunk) {
    const at::Tensor bad = at::isfinite(all.slice(0, start, std::min(all.numel(), start + kChunk))).logical_not();
    if (bad.any().item<bool>()) flat = start + bad.nonzero()[0][0].item<int64_t>();
  }
  if (flat < 0) return;
  const int64_t perSample = t.numel() / t.size(0);
  fail<UsageError>("{}: {} {} at sample {} (element {} of the file) is not finite; the model cannot learn from NaN or "
                   "infinity. HINT: clean the data, e.g. numpy.nan_to_num",
                   path, what, all[flat].item<double>(), flat / perSample, flat);
}

// One file's features and labels, read and checked against each other.
struct Pair {
  std::string featuresPath;
  std::string labelsPath;
  NpyArray features;
  NpyArray labels;
};

Pair readPair(const std::string& featuresPath, const std::string& labelsPath, bool classification) {
  Pair p{featuresPath, labelsPath, readNpy(featuresPath), readNpy(labelsPath)};
  const auto& fshape = p.features.shape;
  const auto& lshape = p.labels.shape;
  if (fshape.size() < 2) {
    fail<UsageError>(
        "{}: features need a sample dimension and at least one more, shape (N, ...); got shape {}. HINT: for one "
        "value per sample, save x.reshape(-1, 1)",
        featuresPath, npyShapeText(fshape));
  }
  if (lshape.size() != 1) {
    fail<UsageError>("{}: labels must be 1-D, shape (N,); got shape {}. HINT: save labels.reshape(-1)", labelsPath,
                     npyShapeText(lshape));
  }
  if (fshape[0] != lshape[0]) {
    fail<UsageError>("{} has {} samples, shape {}, but {} has {} labels, shape {}; they must have the same first "
                     "dimension",
                     featuresPath, fshape[0], npyShapeText(fshape), labelsPath, lshape[0], npyShapeText(lshape));
  }
  if (fshape[0] == 0) {
    fail<UsageError>("{}: no samples (shape {}); a dataset needs at least one", featuresPath, npyShapeText(fshape));
  }
  if (classification && !isIntegral(p.labels.dtype)) {
    fail<UsageError>(
        "{}: labels are {} ('{}'), but classification needs integer class indices. HINT: save "
        "labels.astype(numpy.int64), or set \"task\": \"regression\"",
        labelsPath, npyTypeName(p.labels.dtype), p.labels.descr);
  }
  // A NaN or infinity in the data would surface as a non-finite loss, blamed
  // on the learning rate: named here instead, with the sample it is in.
  checkFinite(p.features, featuresPath, "feature");
  if (!classification) checkFinite(p.labels, labelsPath, "label");
  return p;
}

// What one pass over integer labels finds.
struct LabelScan {
  int64_t max = -1;
  int64_t maxIndex = -1;
  int64_t firstNegative = -1;  // index, or -1
  int64_t firstTooLarge = -1;  // index of the first label >= limit, or -1
  bool twoClasses = false;     // some label differs from the first
};

template <typename T>
LabelScan scanLabels(const T* labels, int64_t n, int64_t limit) {
  LabelScan s;
  const T first = labels[0];
  for (int64_t i = 0; i < n; ++i) {
    const auto v = static_cast<int64_t>(labels[i]);
    if (v < 0 && s.firstNegative < 0) s.firstNegative = i;
    if (limit > 0 && v >= limit && s.firstTooLarge < 0) s.firstTooLarge = i;
    if (v > s.max) {
      s.max = v;
      s.maxIndex = i;
    }
    if (labels[i] != first) s.twoClasses = true;
  }
  return s;
}

LabelScan scanLabels(const NpyArray& labels, int64_t limit) {
  const at::Tensor& t = labels.data;
  const int64_t n = t.numel();
  switch (t.scalar_type()) {
    case at::kByte:
      return scanLabels(t.data_ptr<uint8_t>(), n, limit);
    case at::kInt:
      return scanLabels(t.data_ptr<int32_t>(), n, limit);
    default:
      return scanLabels(t.data_ptr<int64_t>(), n, limit);
  }
}

int64_t labelAt(const NpyArray& labels, int64_t i) { return labels.data[i].item<int64_t>(); }

// The classes 0..classes-1 that no label names, at most `limit` of them
// (labels already checked to lie in that range).
std::vector<int64_t> missingClasses(const NpyArray& labels, int64_t classes, size_t limit) {
  std::vector<bool> seen(static_cast<size_t>(classes), false);
  const at::Tensor all = labels.data.to(at::kLong);
  const int64_t* v = all.data_ptr<int64_t>();
  for (int64_t i = 0; i < all.numel(); ++i) seen[static_cast<size_t>(v[i])] = true;
  std::vector<int64_t> missing;
  for (int64_t c = 0; c < classes && missing.size() < limit; ++c) {
    if (!seen[static_cast<size_t>(c)]) missing.push_back(c);
  }
  return missing;
}

// Checks the class labels of `p` against *numClasses (0: not given, then
// set to the largest label + 1) and returns what the pass found.
// `classesFrom` says where the count came from, for the message.
LabelScan scanClassLabels(const Pair& p, int64_t* numClasses, const std::string& classesFrom) {
  const LabelScan s = scanLabels(p.labels, *numClasses);
  if (s.firstNegative >= 0) {
    fail<UsageError>("{}: label {} at index {} is negative; class labels are 0..C-1. HINT: renumber the labels from 0",
                     p.labelsPath, labelAt(p.labels, s.firstNegative), s.firstNegative);
  }
  if (s.firstTooLarge >= 0) {
    fail<UsageError>("{}: label {} at index {} is not below {}, the number of classes ({}). HINT: {}", p.labelsPath,
                     labelAt(p.labels, s.firstTooLarge), s.firstTooLarge, *numClasses, classesFrom,
                     classesFrom == "dataset.num_classes"
                         ? "raise dataset.num_classes, or set it to 0 to take the largest label + 1"
                         : "set dataset.num_classes to the number of classes");
  }
  if (*numClasses == 0) {
    // Implied by the largest label: then every class must have a sample, as
    // for csv files, so that a stray 7 among 0-2 is an error, not 8 classes.
    const int64_t n = p.labels.data.numel();
    // (One class only is refused later, with its own message.) Compared
    // before adding 1, which overflows at the largest int64.
    if (s.twoClasses && s.max >= n) {
      fail<UsageError>(
          "{}: label {} at index {} implies {} classes, more than the {} samples; class labels must be 0..C-1 with a "
          "sample for each. HINT: renumber the labels 0..C-1, or set dataset.num_classes when some classes have no "
          "sample",
          p.labelsPath, s.max, s.maxIndex, fmt::format("{}", static_cast<uint64_t>(s.max) + 1), n);
    }
    const int64_t implied = s.max + 1;
    std::vector<int64_t> missing = s.twoClasses ? missingClasses(p.labels, implied, 13) : std::vector<int64_t>{};
    const bool more = missing.size() > 12;
    if (more) missing.resize(12);
    if (!missing.empty()) {
      fail<UsageError>(
          "{}: class labels must be 0..C-1 with a sample for each; the largest, {} at index {}, implies {} classes, "
          "but no sample has class {}{}. HINT: renumber the labels 0..C-1, or set dataset.num_classes when some "
          "classes have no sample",
          p.labelsPath, s.max, s.maxIndex, implied, joinNames(missing), more ? ", ..." : "");
    }
    *numClasses = implied;
  }
  return s;
}

// The file a path parameter names, as resolveDataPath finds it, without
// "./" or "a/../" in the messages that name it.
std::string located(const std::string& param, const std::string& value, const DatasetContext& context) {
  return std::filesystem::path(resolveDataPath(param, value, context)).lexically_normal().string();
}

// The split of n rows into test (first numTest of the permutation) and train.
std::pair<std::shared_ptr<std::vector<int64_t>>, std::shared_ptr<std::vector<int64_t>>> splitRows(
    int64_t n, double testFraction, uint64_t seed) {
  const int64_t numTest = testRowCount(n, testFraction);
  std::vector<int64_t> order = seededPermutation(n, seed);
  auto test = std::make_shared<std::vector<int64_t>>(order.begin(), order.begin() + numTest);
  auto train = std::make_shared<std::vector<int64_t>>(order.begin() + numTest, order.end());
  return {train, test};
}

DatasetSplits loadNpy(const Params& params, const DatasetContext& context) {
  const bool classification = params.getString("task") == "classification";
  const double scale = params.getDouble("scale");
  int64_t numClasses = params.getInt("num_classes");
  if (!classification && numClasses != 0) {
    paramError(kDataset, "num_classes", "is for classification; got {} with \"task\": \"regression\"", numClasses);
  }
  if (numClasses == 1) paramError(kDataset, "num_classes", "a classifier needs at least 2 classes, got 1");
  const std::string testFeaturesParam = params.getString("test_features");
  const std::string testLabelsParam = params.getString("test_labels");
  if (testFeaturesParam.empty() != testLabelsParam.empty()) {
    const bool featuresGiven = !testFeaturesParam.empty();
    paramError(kDataset, featuresGiven ? "test_labels" : "test_features", "required when dataset.{} is given",
               featuresGiven ? "test_features" : "test_labels");
  }

  Pair train = readPair(located("features", params.getString("features"), context),
                        located("labels", params.getString("labels"), context), classification);
  std::optional<Pair> test;
  if (!testFeaturesParam.empty()) {
    test = readPair(located("test_features", testFeaturesParam, context),
                    located("test_labels", testLabelsParam, context), classification);
    const std::vector<int64_t> trainSample(train.features.shape.begin() + 1, train.features.shape.end());
    const std::vector<int64_t> testSample(test->features.shape.begin() + 1, test->features.shape.end());
    if (trainSample != testSample) {
      fail<UsageError>("{}: samples of shape {}, but {} has samples of shape {}; they must be alike",
                       test->featuresPath, npyShapeText(testSample), train.featuresPath, npyShapeText(trainSample));
    }
  }

  if (classification) {
    const bool given = numClasses > 0;
    const LabelScan scan = scanClassLabels(train, &numClasses, "dataset.num_classes");
    if (!scan.twoClasses) {
      fail<UsageError>(
          "{}: every label is {}; a classifier needs at least 2 classes. HINT: check the labels file, or set "
          "\"task\": \"regression\"",
          train.labelsPath, labelAt(train.labels, 0));
    }
    if (test) {
      scanClassLabels(*test, &numClasses,
                       given ? "dataset.num_classes" : fmt::format("the largest label in {} + 1", train.labelsPath));
    }
  }

  DatasetSplits splits;
  splits.task = classification ? Task::Classification : Task::Regression;
  splits.numClasses = classification ? numClasses : 0;
  splits.sampleShape.assign(train.features.shape.begin() + 1, train.features.shape.end());
  splits.numFeatures = 1;
  for (int64_t d : splits.sampleShape) splits.numFeatures *= d;
  const at::ScalarType targetType = classification ? at::kLong : at::kFloat;
  if (test) {
    splits.train = std::make_shared<NpyDataset>(train.features.data, train.labels.data, nullptr, scale, targetType);
    splits.test = std::make_shared<NpyDataset>(test->features.data, test->labels.data, nullptr, scale, targetType);
  } else {
    auto [trainRows, testRows] = splitRows(train.features.shape[0], params.getDouble("test_fraction"), context.seed);
    splits.train = std::make_shared<NpyDataset>(train.features.data, train.labels.data, trainRows, scale, targetType);
    splits.test = std::make_shared<NpyDataset>(train.features.data, train.labels.data, testRows, scale, targetType);
  }
  return splits;
}

}  // namespace

PluginSpec npyDataset() {
  return {"npy",
          "NumPy .npy files (numpy.save): features of shape (N, ...) and labels (N,), memory-mapped",
          {
              Param("features", ParamType::String, nullptr,
                    "the features .npy, shape (N, ...): float32, float64, uint8, int32 or int64, C order (a "
                    "relative path: the experiment's folder, the working folder, then the data folders)")
                  .file(),
              Param("labels", ParamType::String, nullptr,
                    "the labels .npy, shape (N,): class indices (integers) or regression targets")
                  .file(),
              Param("test_features", ParamType::String, "",
                    "features of the test split; with test_labels, instead of test_fraction")
                  .file(),
              Param("test_labels", ParamType::String, "", "labels of the test split, with test_features").file(),
              Param("task", ParamType::String, "classification",
                    "classification: labels are class indices 0..C-1; regression: real targets")
                  .oneOf({"classification", "regression"}),
              Param("scale", ParamType::Float, 1.0,
                    "multiplies the features as they become float32, e.g. 0.00392156862745098 (1/255) for uint8 "
                    "pixels")
                  .above(0),
              Param("num_classes", ParamType::Int, 0, "classes; 0 takes the largest label + 1, and then every class needs a sample").atLeast(0),
              testFractionParam(),
          },
          loadNpy};
}

}  // namespace ddp::plugins
