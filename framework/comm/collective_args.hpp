// The arguments of the rooted collectives and alltoall, checked one way
// for every implementation (the defaults of composed_collectives.cpp and
// the backends' own): UsageError naming the rank, the operation and what is
// wrong.
// - reduce, gather, scatter: a root inside the group; gather's root output
//   and scatter's root input hold size() times the other side's elements,
//   of the same dtype.
// - alltoall: rows along dim 0, splits (empty: equal ones) that add up to
//   the rows and hold no negative count, one dtype and one row shape.
// And the blocks they imply: the collectives that move one block per
// ordered pair of ranks (alltoall, gather, scatter) as BlockCounts, which
// each backend moves its own way (gloo: backends/gloo/collectives/
// blocks.hpp; nccl: one group call of ncclSend/ncclRecv).
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

// That this rank sends itself as many rows as it expects from itself
// (UsageError otherwise): what a backend that copies a rank's own rows
// locally must know before it copies.
void checkOwnRows(int rank, int size, const AlltoallSplits& splits);

// By rank, in elements of flat tensors: this rank's block for rank j is
// input[sendAt[j], + sendCount[j]); rank i's arrives at output[recvAt[i],
// + recvCount[i]). Counts may be 0; this rank's own pair is a local copy.
struct BlockCounts {
  std::vector<int64_t> sendAt, sendCount, recvAt, recvCount;
  // The pairs that exchange a block even when it is empty (every pair in
  // alltoall; each rank and the root in gather and scatter), so that a
  // transport that checks counts per message sees every mismatch.
  std::vector<bool> sendsTo, receivesFrom;
  // The largest count of any pair, where every rank knows it (gather,
  // scatter: n); alltoall's needs every rank's splits, so it is 0 here.
  int64_t largest = 0;
};
BlockCounts alltoallBlocks(const AlltoallSplits& splits);
// n elements from every rank to root (output slice i from rank i).
BlockCounts gatherBlocks(int rank, int size, int root, int64_t n);
// n elements from root to every rank (input slice j to rank j).
BlockCounts scatterBlocks(int rank, int size, int root, int64_t n);

}  // namespace ddp
