// alltoall: rows of every rank's input to every rank, a block per ordered
// pair (blocks.hpp). Through shared memory and over the frames' mesh every
// rank first publishes its splits (rows to and from every rank) and checks
// every pair against them, so a pair that disagrees fails the call on
// every rank alike, before any row is read; point to point (above 8 TCP
// ranks), the receiver of an unexpected count fails, naming the sender.
#include <ATen/ATen.h>

#include <algorithm>

#include "backends/gloo/collectives/blocks.hpp"
#include "backends/gloo/collectives/collectives.hpp"
#include "backends/gloo/impl.hpp"
#include "framework/comm/collective_args.hpp"
#include "framework/core/errors.hpp"

namespace ddp::gloo_backend::collectives {

WorkPtr alltoall(Impl& g, const at::Tensor& input, at::Tensor& output, const std::vector<int64_t>& inputSplits,
                 const std::vector<int64_t>& outputSplits, Milliseconds timeout) {
  requireSupported(input, "alltoall");
  requireSupported(output, "alltoall");
  const AlltoallSplits splits = checkAlltoall(g.rank, g.size, input, output, inputSplits, outputSplits);
  const std::vector<int64_t>& send = splits.send;
  const std::vector<int64_t>& recv = splits.recv;
  const int64_t row = splits.rowElements;
  const int rank = g.rank, size = g.size;
  checkOwnRows(rank, size, splits);
  Descriptor d;
  d.op = kAlltoall;
  d.dtype = static_cast<uint32_t>(input.scalar_type());
  d.numel = row;  // the row shape is common; the row counts are the splits, checked apart

  BlockPlan plan;
  static_cast<BlockCounts&>(plan) = alltoallBlocks(splits);
  plan.table = send;
  plan.table.insert(plan.table.end(), recv.begin(), recv.end());
  // Every pair in the same order on every rank: the first that disagrees
  // fails the call everywhere with the same words.
  plan.checkTables = [rank, size, row](const std::vector<const int64_t*>& tables, uint64_t seq) -> int64_t {
    int64_t largest = 0;
    for (int i = 0; i < size; ++i) {
      for (int k = 0; k < size; ++k) {
        const int64_t sends = tables[static_cast<size_t>(i)][k];
        const int64_t expects = tables[static_cast<size_t>(k)][size + i];
        if (sends != expects) {
          fail<AgreedFailure>(
              "[rank {}/{}] gloo alltoall #{}: rank {} sends {} row(s) to rank {}, which expects {} (its "
              "outputSplits[{}]); every rank fails this call. HINT: rank {}'s outputSplits[{}] must equal rank {}'s "
              "inputSplits[{}]",
              rank, size, seq, i, sends, k, expects, i, k, i, i, k);
        }
        largest = std::max(largest, sends);
      }
    }
    return largest * row;
  };

  return enqueueBlocks(g, d, summarize(input), timeout, input, output, std::move(plan));
}

}  // namespace ddp::gloo_backend::collectives
