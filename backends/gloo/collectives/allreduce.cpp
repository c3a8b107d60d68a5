// allreduce: in place on a shared buffer, through shared memory, inside the
// frames (every rank folds the same frames in rank order: identical bits
// everywhere), or over the ring.
#include <cstring>
#include <vector>

#include "backends/gloo/collectives/collectives.hpp"
#include "backends/gloo/impl.hpp"
#include "backends/gloo/shm_channel.hpp"

namespace ddp::gloo_backend::collectives {

WorkPtr allreduce(Impl& g, at::Tensor& tensor, ReduceOp op, Milliseconds timeout) {
  requireSupported(tensor, "allreduce");
  Descriptor d;
  d.op = kAllreduce;
  d.dtype = static_cast<uint32_t>(tensor.scalar_type());
  d.numel = tensor.numel();
  d.reduceOp = static_cast<int32_t>(op);
  std::shared_ptr<ShmBuffer> shared = g.shm ? g.shm->bufferOf(tensor) : nullptr;
  if (shared) d.sharedBuffer = shared->id() + 1;
  const Impl::Path path = shared ? Impl::Path::ShmInPlace : g.pathFor(tensor.nbytes());
  at::Tensor target = tensor;
  return g.enqueue(
      d, summarize(tensor, reduceOpName(op)), timeout, path,
      [g = &g, path, target, shared, op](const Descriptor& d, Deadline deadline) mutable {
        const int rank = g->rank, size = g->size;
        switch (path) {
          case Impl::Path::Local: return;
          case Impl::Path::ShmInPlace: g->shm->allreduceInPlace(d, *shared, target, op, deadline); return;
          case Impl::Path::Shm: {
            at::Tensor host = hostView(target);
            g->shm->allreduce(d, host, op, deadline);  // divides for Avg itself
            if (!host.is_same(target)) target.copy_(host);
            return;
          }
          case Impl::Path::Frame:
          case Impl::Path::Large: break;
        }
        at::Tensor host = hostView(target);
        const size_t bytes = host.nbytes();
        if (path == Impl::Path::Frame) {
          auto frames = g->frames->exchange(d, host.data_ptr(), bytes, deadline);
          if (bytes == 0) return;
          std::vector<uint8_t> mine(static_cast<uint8_t*>(host.data_ptr()),
                                    static_cast<uint8_t*>(host.data_ptr()) + bytes);
          frames[rank] = mine.data();
          const ReduceFn reduce = reduceFnFor(host.scalar_type());
          uint8_t* out = static_cast<uint8_t*>(host.data_ptr());
          std::memcpy(out, frames[0], bytes);
          for (int p = 1; p < size; ++p) reduce(out, frames[p], host.numel(), static_cast<int>(op));
        } else {
          g->frames->exchange(d, nullptr, 0, deadline);
          uint8_t* data = static_cast<uint8_t*>(host.data_ptr());
          g->ring->reduceScatter(data, data, nullptr, host.numel(), host.element_size(),
                                 static_cast<int>(op), static_cast<int>(host.scalar_type()), deadline,
                                 /*thenAllgather=*/true);
        }
        if (op == ReduceOp::Avg) divideInPlace(host, size);
        if (!host.is_same(target)) target.copy_(host);
      });
}

}  // namespace ddp::gloo_backend::collectives
