// allgather: every rank's input, in rank order, into every rank's output;
// through shared memory, inside the frames, or around the ring after an
// empty frame.
#include <cstring>

#include "backends/gloo/collectives/collectives.hpp"
#include "backends/gloo/impl.hpp"
#include "framework/core/errors.hpp"

namespace ddp::gloo_backend::collectives {

WorkPtr allgather(Impl& g, const at::Tensor& input, at::Tensor& output, Milliseconds timeout) {
  requireSupported(input, "allgather");
  if (output.numel() != input.numel() * g.size || input.scalar_type() != output.scalar_type()) {
    fail<UsageError>("gloo allgather: output must hold world size ({}) x input elements of the same dtype; got "
                     "input {}, output {}",
                     g.size, summarize(input), summarize(output));
  }
  Descriptor d;
  d.op = kAllgather;
  d.dtype = static_cast<uint32_t>(input.scalar_type());
  d.numel = input.numel();
  const Impl::Path path = g.pathFor(input.nbytes());
  at::Tensor in = input, out = output;
  return g.enqueue(d, summarize(input), timeout, path,
                   [g = &g, path, in, out](const Descriptor& d, Deadline deadline) mutable {
                     const int rank = g->rank, size = g->size;
                     at::Tensor src = hostView(in);
                     at::Tensor dst = hostView(out);
                     const size_t bytes = src.nbytes();
                     if (path == Impl::Path::Local) {
                       if (bytes > 0) dst.view({-1}).copy_(src.view({-1}));
                     } else if (path == Impl::Path::Shm) {
                       g->shm->allgather(d, src, dst, deadline);
                     } else if (path == Impl::Path::Frame) {
                       auto frames = g->frames->exchange(d, src.data_ptr(), bytes, deadline);
                       frames[rank] = static_cast<const uint8_t*>(src.data_ptr());
                       uint8_t* outBytes = static_cast<uint8_t*>(dst.data_ptr());
                       // This rank's own slice first: an input inside the
                       // output is then copied before anything overwrites it.
                       for (int i = 0; i < size && bytes; ++i) {
                         const int p = (rank + i) % size;
                         if (outBytes + p * bytes != frames[p]) std::memmove(outBytes + p * bytes, frames[p], bytes);
                       }
                     } else {
                       g->frames->exchange(d, nullptr, 0, deadline);
                       g->ring->allgather(static_cast<const uint8_t*>(src.data_ptr()),
                                          static_cast<uint8_t*>(dst.data_ptr()), bytes, deadline);
                     }
                     if (!dst.is_same(out)) out.copy_(dst);
                   });
}

}  // namespace ddp::gloo_backend::collectives
