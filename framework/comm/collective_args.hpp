// The arguments of the rooted collectives and alltoall, checked one way
// for every implementation (the defaults of composed_collectives.cpp and
// the backends' own): UsageError naming the rank, the operation and what is
// wrong.
// - reduce, gather, scatter: a root inside the group; gather's root output
//   and scatter's root input hold size() times the other side's elements,
//   of the same dtype.
// - alltoall: rows along dim 0, splits (empty: equal ones) that add up to
//   the rows and hold no negative count, one dtype and one row shape.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace ddp {

struct AlltoallSplits {
  std::vector<int64_t> send, recv;  // rows to / from each rank
  int64_t rowElements = 1;          // elements per row
};

void checkRoot(int rank, int size, int root, const char* op);
// On the root only (elsewhere the other side is not used).
void checkGather(int rank, int size, const at::Tensor& input, const at::Tensor& output, int root);
void checkScatter(int rank, int size, const at::Tensor& input, const at::Tensor& output, int root);

AlltoallSplits checkAlltoall(int rank, int size, const at::Tensor& input, const at::Tensor& output,
                             const std::vector<int64_t>& inputSplits, const std::vector<int64_t>& outputSplits);

}  // namespace ddp
