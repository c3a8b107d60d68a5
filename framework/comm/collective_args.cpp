// The rooted collectives' and alltoall's arguments (collective_args.hpp).
#include "framework/comm/collective_args.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "framework/comm/process_group.hpp"
#include "framework/core/errors.hpp"

namespace ddp {
namespace {

int64_t rowElementsOf(const at::Tensor& t) {
  int64_t n = 1;
  for (int64_t d = 1; d < t.dim(); ++d) n *= t.size(d);
  return n;
}

void checkSameDtype(int rank, int size, const at::Tensor& a, const at::Tensor& b, const char* op) {
  if (a.scalar_type() != b.scalar_type()) {
    fail<UsageError>("[rank {}/{}] {}: input is {}, output {}; they must match", rank, size, op, dtypeName(a),
                     dtypeName(b));
  }
}

}  // namespace

void checkRoot(int rank, int size, int root, const char* op) {
  if (root < 0 || root >= size) {
    fail<UsageError>("[rank {}/{}] {}: root {} is outside the group's {} ranks", rank, size, op, root, size);
  }
}

void checkGather(int rank, int size, const at::Tensor& input, const at::Tensor& output, int root) {
  checkRoot(rank, size, root, "gather");
  if (rank != root) return;
  checkSameDtype(rank, size, input, output, "gather");
  if (output.numel() != input.numel() * size) {
    fail<UsageError>("[rank {}/{}] gather: root's output has {} elements, expected {} x {} ranks", rank, size,
                     output.numel(), input.numel(), size);
  }
}

void checkScatter(int rank, int size, const at::Tensor& input, const at::Tensor& output, int root) {
  checkRoot(rank, size, root, "scatter");
  if (rank != root) return;
  checkSameDtype(rank, size, input, output, "scatter");
  if (input.numel() != output.numel() * size) {
    fail<UsageError>("[rank {}/{}] scatter: root's input has {} elements, expected {} x {} ranks", rank, size,
                     input.numel(), output.numel(), size);
  }
}

AlltoallSplits checkAlltoall(int rank, int size, const at::Tensor& input, const at::Tensor& output,
                             const std::vector<int64_t>& inputSplits, const std::vector<int64_t>& outputSplits) {
  const auto bad = [&](const std::string& what) { fail<UsageError>("[rank {}/{}] alltoall: {}", rank, size, what); };
  if (input.scalar_type() != output.scalar_type()) {
    bad(fmt::format("input is {}, output {}; they must match", dtypeName(input), dtypeName(output)));
  }
  if (input.dim() == 0 || output.dim() == 0) bad("input and output need a dim 0 of rows");
  if (input.numel() > 0 && output.numel() > 0 && input.is_alias_of(output)) {
    // Views of one storage may still be apart; contiguous ones are checked
    // byte by byte, strided ones are refused.
    const auto* a = static_cast<const char*>(input.data_ptr());
    const auto* b = static_cast<const char*>(output.data_ptr());
    const bool apart = input.is_contiguous() && output.is_contiguous() &&
                       (a + input.nbytes() <= b || b + output.nbytes() <= a);
    if (!apart) bad("input and output share memory. HINT: give alltoall an output tensor of its own");
  }
  AlltoallSplits out;
  out.rowElements = rowElementsOf(input);
  if (rowElementsOf(output) != out.rowElements) {
    bad(fmt::format("input rows have {} elements, output rows {}", out.rowElements, rowElementsOf(output)));
  }
  const auto splitsOr = [&](const std::vector<int64_t>& splits, int64_t rows, const char* which) {
    if (splits.empty()) {
      if (rows % size != 0) {
        bad(fmt::format("{} has {} rows, which {} ranks cannot split equally; give {}Splits", which, rows, size, which));
      }
      return std::vector<int64_t>(static_cast<size_t>(size), rows / size);
    }
    if (static_cast<int>(splits.size()) != size) {
      bad(fmt::format("{}Splits has {} entries for {} ranks", which, splits.size(), size));
    }
    int64_t sum = 0;
    for (int64_t s : splits) {
      if (s < 0) bad(fmt::format("{}Splits [{}] holds a negative count", which, fmt::join(splits, ",")));
      sum += s;
    }
    if (sum != rows) {
      bad(fmt::format("{}Splits [{}] add up to {}, but it has {} rows", which, fmt::join(splits, ","), sum, rows));
    }
    return splits;
  };
  out.send = splitsOr(inputSplits, input.size(0), "input");
  out.recv = splitsOr(outputSplits, output.size(0), "output");
  return out;
}

namespace {

std::vector<int64_t> offsetsOf(const std::vector<int64_t>& counts) {
  std::vector<int64_t> at(counts.size(), 0);
  for (size_t j = 1; j < counts.size(); ++j) at[j] = at[j - 1] + counts[j - 1];
  return at;
}

// Every rank's n elements meet at `root`: from the root's point of view
// its input is sliced (scatter) or its output is (gather).
BlockCounts rootedBlocks(int rank, int size, int root, int64_t n, bool rootSends) {
  const auto ranks = static_cast<size_t>(size), r = static_cast<size_t>(root);
  BlockCounts b;
  b.sendAt.assign(ranks, 0);
  b.sendCount.assign(ranks, 0);
  b.recvAt.assign(ranks, 0);
  b.recvCount.assign(ranks, 0);
  std::vector<int64_t>& sliced = rootSends ? b.sendCount : b.recvCount;
  std::vector<int64_t>& slicedAt = rootSends ? b.sendAt : b.recvAt;
  std::vector<int64_t>& single = rootSends ? b.recvCount : b.sendCount;
  std::vector<bool>& slicedPairs = rootSends ? b.sendsTo : b.receivesFrom;
  std::vector<bool>& singlePair = rootSends ? b.receivesFrom : b.sendsTo;
  b.sendsTo.assign(ranks, false);
  b.receivesFrom.assign(ranks, false);
  single[r] = n;
  singlePair[r] = true;
  if (rank == root) {
    for (size_t j = 0; j < ranks; ++j) {
      slicedAt[j] = static_cast<int64_t>(j) * n;
      sliced[j] = n;
      slicedPairs[j] = true;
    }
  }
  b.largest = n;
  return b;
}

}  // namespace

void checkOwnRows(int rank, int size, const AlltoallSplits& splits) {
  const auto me = static_cast<size_t>(rank);
  if (splits.send[me] != splits.recv[me]) {
    fail<UsageError>("[rank {}/{}] alltoall: it sends itself {} row(s) but expects {}", rank, size, splits.send[me],
                     splits.recv[me]);
  }
}

BlockCounts alltoallBlocks(const AlltoallSplits& splits) {
  BlockCounts b;
  for (size_t j = 0; j < splits.send.size(); ++j) {
    b.sendCount.push_back(splits.send[j] * splits.rowElements);
    b.recvCount.push_back(splits.recv[j] * splits.rowElements);
  }
  b.sendAt = offsetsOf(b.sendCount);
  b.recvAt = offsetsOf(b.recvCount);
  b.sendsTo.assign(splits.send.size(), true);
  b.receivesFrom.assign(splits.recv.size(), true);
  return b;
}

BlockCounts gatherBlocks(int rank, int size, int root, int64_t n) {
  return rootedBlocks(rank, size, root, n, /*rootSends=*/false);
}

BlockCounts scatterBlocks(int rank, int size, int root, int64_t n) {
  return rootedBlocks(rank, size, root, n, /*rootSends=*/true);
}

}  // namespace ddp
