// alltoall's arguments, checked one way for every implementation: rows
// along dim 0, splits (empty: equal ones) that add up to the rows and hold
// no negative count, one dtype and one row shape. UsageError naming the
// rank and what is wrong.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace ddp {

struct AlltoallSplits {
  std::vector<int64_t> send, recv;  // rows to / from each rank
  int64_t rowElements = 1;          // elements per row
};

AlltoallSplits checkAlltoall(int rank, int size, const at::Tensor& input, const at::Tensor& output,
                             const std::vector<int64_t>& inputSplits, const std::vector<int64_t>& outputSplits);

}  // namespace ddp
