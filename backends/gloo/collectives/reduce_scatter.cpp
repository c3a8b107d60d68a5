// reduce_scatter: rank r gets the reduction of block r of every rank's
// input; through shared memory, inside the frames, or over the ring.
#include <cstring>
#include <vector>

#include "backends/gloo/collectives/collectives.hpp"
#include "backends/gloo/impl.hpp"
#include "framework/core/errors.hpp"

namespace ddp::gloo_backend::collectives {
WorkPtr reduceScatter(Impl& g, const at::Tensor& input, at::Tensor& output, ReduceOp op, Milliseconds timeout) {
  requireSupported(input, "reduce_scatter");
  if (input.numel() != output.numel() * g.size || input.scalar_type() != output.scalar_type()) {
    fail<UsageError>("gloo reduce_scatter: input must hold world size ({}) x output elements of the same dtype; "
                     "got input {}, output {}",
                     g.size, summarize(input), summarize(output));
  }
  Descriptor d;
  d.op = kReduceScatter;
  d.dtype = static_cast<uint32_t>(input.scalar_type());
  d.numel = input.numel();
  d.reduceOp = static_cast<int32_t>(op);
  const Impl::Path path = g.pathFor(input.nbytes());
  at::Tensor in = input, out = output;
  return g.enqueue(
      d, summarize(input, reduceOpName(op)), timeout, path,
      [g = &g, path, in, out, op](const Descriptor& d, Deadline deadline) mutable {
        const int rank = g->rank, size = g->size;
        at::Tensor src = hostView(in);
        const size_t bytes = src.nbytes(), sliceBytes = bytes / size;
        const size_t elementSize = src.element_size();
        // Reduce straight into the output when it is a contiguous host
        // tensor: a fresh buffer per call costs page faults at every size.
        at::Tensor outHost = hostView(out);
        at::Tensor mine = outHost.view({-1});
        switch (path) {
          case Impl::Path::Local: mine.copy_(src.view({-1})); break;
          case Impl::Path::Shm:
            g->shm->reduceScatter(d, src, mine, op, deadline);  // divides for Avg itself
            if (!outHost.is_same(out)) out.copy_(outHost);
            return;
          case Impl::Path::Frame: {
            auto frames = g->frames->exchange(d, src.data_ptr(), bytes, deadline);
            frames[rank] = static_cast<const uint8_t*>(src.data_ptr());
            // An output inside the input would be overwritten before this
            // rank's own part is read: read that from a copy.
            std::vector<uint8_t> own;
            const auto* outAt = static_cast<const uint8_t*>(mine.data_ptr());
            if (sliceBytes > 0 && outAt < frames[rank] + bytes && frames[rank] < outAt + sliceBytes) {
              own.assign(frames[rank], frames[rank] + bytes);
              frames[rank] = own.data();
            }
            if (sliceBytes > 0) {
              const ReduceFn reduce = reduceFnFor(src.scalar_type());
              uint8_t* acc = static_cast<uint8_t*>(mine.data_ptr());
              std::memcpy(acc, frames[0] + rank * sliceBytes, sliceBytes);
              for (int p = 1; p < size; ++p) {
                reduce(acc, frames[p] + rank * sliceBytes, out.numel(), static_cast<int>(op));
              }
            }
            break;
          }
          case Impl::Path::ShmInPlace:  // allreduce only
          case Impl::Path::Large: {
            g->frames->exchange(d, nullptr, 0, deadline);
            // The ring keeps its partial sums in a reused buffer and reads
            // this rank's contributions from the input as it goes; the sum
            // lands in the output. An output that overlaps the input other
            // than as this rank's block reads from a copy of the input.
            std::vector<uint8_t>& work = g->reduceScatterIn;
            const auto* input = static_cast<const uint8_t*>(src.data_ptr());
            auto* output = static_cast<uint8_t*>(mine.data_ptr());
            const bool overlaps = sliceBytes > 0 && output < input + bytes && input < output + sliceBytes;
            const bool copy = overlaps && output != input + rank * sliceBytes;
            // At two ranks the only partial sum is the last, into the output.
            if ((size > 2 || copy) && work.size() < bytes) work.resize(bytes);
            if (copy) {
              std::memcpy(work.data(), input, bytes);
              input = work.data();
            }
            g->ring->reduceScatter(input, work.data(), output, src.numel(), elementSize, static_cast<int>(op),
                                   static_cast<int>(src.scalar_type()), deadline, /*thenAllgather=*/false);
            break;
          }
        }
        if (op == ReduceOp::Avg) divideInPlace(mine, size);
        if (!outHost.is_same(out)) out.copy_(outHost);
      });
}

}  // namespace ddp::gloo_backend::collectives
