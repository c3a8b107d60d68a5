// alltoall: rows of every rank's input to every rank. Three ways:
// - Shm (one host): the ranks first publish their splits (what each sends
//   to and expects from every rank) in one round, then move the blocks
//   through the slots (ShmCollectives::alltoall);
// - Frame (TCP, up to FrameExchange::kAllToAllMaxRanks ranks): the splits
//   travel in the frames, then every block goes straight from the sender's
//   input to the receiver's output over the frames' mesh of connections,
//   all pairs at once;
// - PointToPoint (TCP, more ranks: the frames form a ring there): one
//   message per ordered pair (framework/comm/point_to_point.hpp); each
//   carries its element count, so a receiver whose outputSplits disagree
//   fails naming the sender and both counts.
// On the first two, every rank sees every rank's splits, so a pair that
// disagrees fails the call on every rank alike, before any row moves. A
// rank's own rows are copied. All run on the worker (or in the caller) in
// call order with the other collectives.
#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>

#include "backends/gloo/collectives/collectives.hpp"
#include "backends/gloo/impl.hpp"
#include "framework/comm/alltoall_splits.hpp"
#include "framework/core/errors.hpp"

namespace ddp::gloo_backend::collectives {
namespace {

// Where each rank's block starts, in elements, from counts in elements.
std::vector<int64_t> offsetsOf(const std::vector<int64_t>& counts) {
  std::vector<int64_t> at(counts.size(), 0);
  for (size_t j = 1; j < counts.size(); ++j) at[j] = at[j - 1] + counts[j - 1];
  return at;
}

// Every rank's published splits (send rows to each rank, then recv rows
// from each) checked pair by pair, in the same order on every rank: the
// first pair that disagrees fails the call everywhere with the same words.
// Returns the largest block of any pair, in rows.
int64_t checkEveryPair(const std::vector<const int64_t*>& tables, int rank, int size, uint64_t seq) {
  int64_t largest = 0;
  for (int i = 0; i < size; ++i) {
    for (int k = 0; k < size; ++k) {
      const int64_t sends = tables[static_cast<size_t>(i)][k];
      const int64_t expects = tables[static_cast<size_t>(k)][size + i];
      if (sends != expects) {
        fail<CollectiveError>(
            "[rank {}/{}] gloo alltoall #{}: rank {} sends {} row(s) to rank {}, which expects {} (its "
            "outputSplits[{}]); every rank fails this call. HINT: rank {}'s outputSplits[{}] must equal rank {}'s "
            "inputSplits[{}]",
            rank, size, seq, i, sends, k, expects, i, k, i, i, k);
      }
      largest = std::max(largest, sends);
    }
  }
  return largest;
}

}  // namespace

WorkPtr alltoall(Impl& g, const at::Tensor& input, at::Tensor& output, const std::vector<int64_t>& inputSplits,
                 const std::vector<int64_t>& outputSplits, Milliseconds timeout) {
  requireSupported(input, "alltoall");
  requireSupported(output, "alltoall");
  const AlltoallSplits splits = checkAlltoall(g.rank, g.size, input, output, inputSplits, outputSplits);
  const std::vector<int64_t>& send = splits.send;
  const std::vector<int64_t>& recv = splits.recv;
  const int64_t row = splits.rowElements;
  if (send[static_cast<size_t>(g.rank)] != recv[static_cast<size_t>(g.rank)]) {
    fail<UsageError>("[rank {}/{}] alltoall: it sends itself {} row(s) but expects {}", g.rank, g.size,
                     send[static_cast<size_t>(g.rank)], recv[static_cast<size_t>(g.rank)]);
  }
  Descriptor d;
  d.op = kAlltoall;
  d.dtype = static_cast<uint32_t>(input.scalar_type());
  d.numel = row;  // the row shape is common; the row counts are the splits, checked apart
  Impl::Path path = Impl::Path::PointToPoint;
  if (g.size == 1) {
    path = Impl::Path::Local;
  } else if (g.shm) {
    path = Impl::Path::Shm;
  } else if (g.frames && g.frames->isMesh()) {
    path = Impl::Path::Frame;
  }
  const size_t payload = std::max(input.nbytes(), output.nbytes());
  at::Tensor in = input, out = output;
  auto run = [g = &g, path, in, out, send, recv, row](const Descriptor& d, Deadline deadline) mutable {
    const int rank = g->rank, size = g->size;
    at::Tensor src = in.detach().to(at::kCPU).contiguous().view({-1});
    at::Tensor dst = out.device().is_cpu() && out.is_contiguous() ? out.view({-1})
                                                                  : at::empty({out.numel()}, out.options().device(at::kCPU));
    std::vector<int64_t> sendCount(send.size()), recvCount(recv.size());
    for (size_t j = 0; j < send.size(); ++j) {
      sendCount[j] = send[j] * row;
      recvCount[j] = recv[j] * row;
    }
    const std::vector<int64_t> sendAt = offsetsOf(sendCount), recvAt = offsetsOf(recvCount);
    const auto slice = [](at::Tensor& t, const std::vector<int64_t>& at, const std::vector<int64_t>& count, int k) {
      return t.narrow(0, at[static_cast<size_t>(k)], count[static_cast<size_t>(k)]);
    };
    slice(dst, recvAt, recvCount, rank).copy_(slice(src, sendAt, sendCount, rank));

    if (path == Impl::Path::Shm || path == Impl::Path::Frame) {
      std::vector<int64_t> mine(send);
      mine.insert(mine.end(), recv.begin(), recv.end());
      const size_t tableBytes = mine.size() * sizeof(int64_t);
      // Every rank's table (this rank's null: `mine`), checked; the largest
      // block of any pair, in elements.
      const auto checkTables = [&](const std::vector<const uint8_t*>& areas) {
        // Copied out: a frame's payload may sit at any alignment.
        std::vector<std::vector<int64_t>> copies(static_cast<size_t>(size), mine);
        std::vector<const int64_t*> tables;
        for (int p = 0; p < size; ++p) {
          if (p != rank) std::memcpy(copies[static_cast<size_t>(p)].data(), areas[static_cast<size_t>(p)], tableBytes);
          tables.push_back(copies[static_cast<size_t>(p)].data());
        }
        return checkEveryPair(tables, rank, size, d.seq) * row;
      };
      if (path == Impl::Path::Shm) {
        const int64_t largest = checkTables(g->shm->exchange(d, mine.data(), tableBytes, deadline));
        g->shm->alltoall(d, src, dst, sendAt, sendCount, recvAt, recvCount, largest, deadline);
      } else {
        const size_t es = src.element_size();
        uint8_t* srcBytes = static_cast<uint8_t*>(src.data_ptr());
        uint8_t* dstBytes = static_cast<uint8_t*>(dst.data_ptr());
        std::vector<FrameExchange::Span> sendBlocks(static_cast<size_t>(size)), recvBlocks(static_cast<size_t>(size));
        for (size_t p = 0; p < static_cast<size_t>(size); ++p) {
          sendBlocks[p] = {srcBytes + sendAt[p] * es, static_cast<size_t>(sendCount[p]) * es};
          recvBlocks[p] = {dstBytes + recvAt[p] * es, static_cast<size_t>(recvCount[p]) * es};
        }
        g->frames->exchangeThenTransfer(d, mine.data(), tableBytes, sendBlocks, recvBlocks,
                                        [&](const std::vector<const uint8_t*>& areas) { checkTables(areas); },
                                        deadline);
      }
    } else if (path == Impl::Path::PointToPoint) {
      // Internal tags are negative (users' are >= 0), one per collective.
      const int tag = -1 - static_cast<int>(d.seq % (uint64_t(1) << 30));
      const auto left = [&] {
        return std::max(Milliseconds(1), std::chrono::duration_cast<Milliseconds>(deadline - Clock::now()));
      };
      std::vector<WorkPtr> works;
      for (int k = 1; k < size; ++k) {  // staggered: rank r first talks to r + 1
        const int to = (rank + k) % size, from = (rank - k + size) % size;
        at::Tensor part = slice(dst, recvAt, recvCount, from);
        works.push_back(g->p2p->recv(part, from, tag, left()));
        works.push_back(g->p2p->send(slice(src, sendAt, sendCount, to), to, tag, left()));
      }
      for (size_t k = 0; k < works.size(); ++k) {
        try {
          works[k]->wait();
        } catch (const CollectiveError& e) {
          const int from = (rank - static_cast<int>(k / 2) - 1 + size) % size;
          if (k % 2 == 0) {
            fail<CollectiveError>("[rank {}/{}] gloo alltoall #{}: rows from rank {} (outputSplits[{}] = {} row(s) of "
                                  "{}): {}",
                                  rank, size, d.seq, from, from, recv[static_cast<size_t>(from)], row, e.what());
          }
          throw;
        }
      }
    }
    if (!(out.device().is_cpu() && out.is_contiguous())) out.copy_(dst.view(out.sizes()));
  };
  return g.enqueue(d, summarize(input), timeout, path, std::move(run), payload);
}

}  // namespace ddp::gloo_backend::collectives
