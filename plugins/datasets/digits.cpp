#include "plugins/datasets/digits.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <fstream>

#include "framework/core/system.hpp"
#include "plugins/common.hpp"
#include "plugins/datasets/files.hpp"

namespace ddp::plugins {

namespace {

constexpr int64_t kSide = 8;
constexpr int64_t kPixels = kSide * kSide;
constexpr int64_t kClasses = 10;
constexpr int kMaxPixel = 16;

}  // namespace

DatasetSplits loadDigits(const Params& params, const DatasetContext& context) {
  const std::string path = resolveDataPath("path", params.getString("path"), context);
  std::ifstream in(path);
  if (!in) fail<UsageError>("dataset digits: '{}' cannot be opened: {}", path, errnoText(errno));
  std::vector<float> pixels;
  std::vector<int64_t> labels;
  std::vector<int64_t> perClass(kClasses, 0);
  std::string line;
  int64_t lineNumber = 0;
  while (std::getline(in, line)) {
    ++lineNumber;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    const char* p = line.data();
    const char* end = p + line.size();
    for (int64_t column = 1; column <= kPixels + 1; ++column) {
      int value = -1;
      auto [next, ec] = std::from_chars(p, end, value);
      const int64_t limit = column <= kPixels ? kMaxPixel : kClasses - 1;
      if (ec != std::errc() || value < 0 || value > limit) {
        fail<UsageError>("{}:{}: column {}: expected an integer 0..{}, found '{}'", path, lineNumber, column, limit,
                         std::string(p, std::find(p, end, ',')));
      }
      p = next;
      const bool last = column == kPixels + 1;
      if (!last && (p == end || *p != ',')) {
        fail<UsageError>("{}:{}: expected {} columns (64 pixels and the digit), found {}", path, lineNumber,
                         kPixels + 1, column);
      }
      if (last && p != end) {
        fail<UsageError>("{}:{}: expected {} columns (64 pixels and the digit), found more", path, lineNumber,
                         kPixels + 1);
      }
      if (!last) ++p;
      if (column <= kPixels) {
        pixels.push_back(static_cast<float>(value) / kMaxPixel);
      } else {
        labels.push_back(value);
        ++perClass[static_cast<size_t>(value)];
      }
    }
  }
  if (labels.empty()) fail<UsageError>("dataset digits: '{}' holds no images", path);
  for (int64_t c = 0; c < kClasses; ++c) {
    if (perClass[static_cast<size_t>(c)] == 0) fail<UsageError>("{}: no image of the digit {}", path, c);
  }
  const auto n = static_cast<int64_t>(labels.size());
  const int64_t numTest = testRowCount(n, params.getDouble("test_fraction"));
  const at::Tensor images = at::from_blob(pixels.data(), {n, 1, kSide, kSide}, at::kFloat);
  const at::Tensor targets = at::from_blob(labels.data(), {n}, at::kLong);
  std::vector<int64_t> order = seededPermutation(n, context.seed);
  const at::Tensor index = at::from_blob(order.data(), {n}, at::kLong);
  const at::Tensor testIndex = index.slice(0, 0, numTest), trainIndex = index.slice(0, numTest, n);
  // index_select copies, so the tensors own their memory.
  return tensorSplits(images.index_select(0, trainIndex), targets.index_select(0, trainIndex),
                      images.index_select(0, testIndex), targets.index_select(0, testIndex), kClasses);
}

}  // namespace ddp::plugins
