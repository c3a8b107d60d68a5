// Dataset: a sized collection of samples that hands out batches by index.
//
// Contract
// - size() samples, numbered 0..size()-1. get(indices) returns the samples
//   at those indices, in that order, stacked along a new first dimension:
//     inputs  [n, *sampleShape]  float32 (features, images) or int64 (token ids)
//     targets [n]                int64 class indices, or float32 regression values
//             [n, T]             int64 next-token ids (or float32 regression rows)
//   An index outside [0, size()) is a c10::Error naming it and the size.
// - A dataset computes a batch when asked, so what it serves need not be
//   materialised: a text corpus serves windows of its one token array, an
//   .npy file is memory-mapped and converted a batch at a time.
// - get() is const and may be called from several threads at once (a
//   prefetching loader); implementations keep no mutable state.
// - Batches live on the CPU; the trainer moves them to its device.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <memory>

namespace ddp {

struct Batch {
  at::Tensor inputs;
  at::Tensor targets;
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual Batch get(c10::ArrayRef<int64_t> indices) const = 0;

  // Samples [begin, begin + n) (clamped to size()), for evaluation and tests.
  Batch range(int64_t begin, int64_t n) const;
  // Every sample, in order.
  Batch all() const { return range(0, size()); }
};

using DatasetPtr = std::shared_ptr<const Dataset>;

// Rows `indices` of `src` (first dimension) as a new tensor: one memcpy per
// row for a contiguous CPU tensor, index_select otherwise. Checks each index.
at::Tensor gatherRows(const at::Tensor& src, c10::ArrayRef<int64_t> indices);

// Samples held in memory (or memory-mapped) as two tensors with the same
// first dimension: row i of each is sample i.
class TensorDataset final : public Dataset {
 public:
  TensorDataset(at::Tensor inputs, at::Tensor targets);
  int64_t size() const override { return inputs_.size(0); }
  Batch get(c10::ArrayRef<int64_t> indices) const override;
  const at::Tensor& inputs() const { return inputs_; }
  const at::Tensor& targets() const { return targets_; }

 private:
  at::Tensor inputs_;
  at::Tensor targets_;
};

}  // namespace ddp
