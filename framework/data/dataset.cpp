#include "framework/data/dataset.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace ddp {

Batch Dataset::range(int64_t begin, int64_t n) const {
  const int64_t end = std::min(size(), begin + std::max<int64_t>(n, 0));
  std::vector<int64_t> indices;
  for (int64_t i = begin; i < end; ++i) indices.push_back(i);
  return get(indices);
}

at::Tensor gatherRows(const at::Tensor& src, c10::ArrayRef<int64_t> indices) {
  TORCH_CHECK(src.dim() >= 1, "gatherRows: a tensor without rows (0-d)");
  const int64_t available = src.size(0);
  const auto n = static_cast<int64_t>(indices.size());
  for (int64_t row : indices) {
    TORCH_CHECK(row >= 0 && row < available, "sample index ", row, " out of range for ", available, " samples");
  }
  if (src.device().is_cpu() && src.layout() == at::kStrided && src.is_contiguous() && !src.requires_grad()) {
    // One memcpy per row: cheaper, for a small batch, than an index tensor
    // and index_select.
    std::vector<int64_t> shape(src.sizes().begin(), src.sizes().end());
    shape[0] = n;
    at::Tensor out = at::empty(shape, src.options());
    const size_t rowBytes = static_cast<size_t>(src.numel() / std::max<int64_t>(available, 1)) * src.element_size();
    const auto* from = static_cast<const char*>(src.data_ptr());
    auto* to = static_cast<char*>(out.data_ptr());
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(to + static_cast<size_t>(i) * rowBytes, from + static_cast<size_t>(indices[i]) * rowBytes, rowBytes);
    }
    return out;
  }
  at::Tensor index = at::empty({n}, at::kLong);
  std::copy(indices.begin(), indices.end(), index.data_ptr<int64_t>());
  return src.index_select(0, index.to(src.device()));
}

TensorDataset::TensorDataset(at::Tensor inputs, at::Tensor targets)
    : inputs_(std::move(inputs)), targets_(std::move(targets)) {
  TORCH_CHECK(inputs_.defined() && targets_.defined() && inputs_.dim() >= 1 && targets_.dim() >= 1,
              "TensorDataset: inputs and targets need a first (sample) dimension");
  TORCH_CHECK(inputs_.size(0) == targets_.size(0), "TensorDataset: ", inputs_.size(0), " inputs but ",
              targets_.size(0), " targets");
}

Batch TensorDataset::get(c10::ArrayRef<int64_t> indices) const {
  return {gatherRows(inputs_, indices), gatherRows(targets_, indices)};
}

}  // namespace ddp
