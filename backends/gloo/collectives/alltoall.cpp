// alltoall: rows of every rank's input to every rank, as one message per
// ordered pair of ranks (framework/comm/point_to_point.hpp), queued on the
// worker so that it runs in call order with the other collectives. Each
// message carries its element count, so a receiver whose outputSplits
// disagree with a sender fails naming both; a rank's own rows are copied.
#include <ATen/ATen.h>

#include "backends/gloo/collectives/collectives.hpp"
#include "backends/gloo/impl.hpp"
#include "framework/comm/alltoall_splits.hpp"
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
  const auto bad = [&](const std::string& what) {
    fail<UsageError>("[rank {}/{}] alltoall: {}", g.rank, g.size, what);
  };
  if (send[static_cast<size_t>(g.rank)] != recv[static_cast<size_t>(g.rank)]) {
    bad(fmt::format("it sends itself {} row(s) but expects {}", send[static_cast<size_t>(g.rank)],
                    recv[static_cast<size_t>(g.rank)]));
  }
  Descriptor d;
  d.op = kAlltoall;
  d.dtype = static_cast<uint32_t>(input.scalar_type());
  d.numel = input.numel();
  at::Tensor in = input, out = output;
  const Impl::Path path = g.size == 1 ? Impl::Path::Local : Impl::Path::PointToPoint;
  return g.enqueue(d, summarize(input), timeout, path, [g = &g, in, out, send, recv, row](const Descriptor& d,
                                                                                           Deadline deadline) mutable {
    const int rank = g->rank, size = g->size;
    at::Tensor src = in.detach().to(at::kCPU).contiguous().view({-1});
    at::Tensor dst = out.device().is_cpu() && out.is_contiguous() ? out.view({-1})
                                                                  : at::empty({out.numel()}, out.options().device(at::kCPU));
    std::vector<int64_t> sendAt(static_cast<size_t>(size), 0), recvAt(static_cast<size_t>(size), 0);
    for (int j = 1; j < size; ++j) {
      sendAt[static_cast<size_t>(j)] = sendAt[static_cast<size_t>(j - 1)] + send[static_cast<size_t>(j - 1)] * row;
      recvAt[static_cast<size_t>(j)] = recvAt[static_cast<size_t>(j - 1)] + recv[static_cast<size_t>(j - 1)] * row;
    }
    const auto slice = [&](at::Tensor& t, const std::vector<int64_t>& at, const std::vector<int64_t>& rows, int k) {
      return t.narrow(0, at[static_cast<size_t>(k)], rows[static_cast<size_t>(k)] * row);
    };
    if (size > 1) {
      // Internal tags are negative (users' are >= 0), one per collective.
      const int tag = -1 - static_cast<int>(d.seq % (uint64_t(1) << 30));
      const auto left = [&] {
        return std::max(Milliseconds(1), std::chrono::duration_cast<Milliseconds>(deadline - Clock::now()));
      };
      std::vector<WorkPtr> works;
      for (int k = 1; k < size; ++k) {  // staggered: rank r first talks to r + 1
        const int to = (rank + k) % size, from = (rank - k + size) % size;
        at::Tensor part = slice(dst, recvAt, recv, from);
        works.push_back(g->p2p->recv(part, from, tag, left()));
        works.push_back(g->p2p->send(slice(src, sendAt, send, to), to, tag, left()));
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
    slice(dst, recvAt, recv, rank).copy_(slice(src, sendAt, send, rank));
    if (!(out.device().is_cpu() && out.is_contiguous())) out.copy_(dst.view(out.sizes()));
  });
}

}  // namespace ddp::gloo_backend::collectives
