// broadcast: root's tensor to every rank; through shared memory, inside the
// root's frame, or along the ring after an empty frame.
#include <cstring>

#include "backends/gloo/collectives/collectives.hpp"
#include "backends/gloo/impl.hpp"
#include "framework/core/errors.hpp"

namespace ddp::gloo_backend::collectives {

WorkPtr broadcast(Impl& g, at::Tensor& tensor, int root, Milliseconds timeout) {
  requireSupported(tensor, "broadcast");
  if (root < 0 || root >= g.size) {
    fail<UsageError>("gloo broadcast: root {} is outside world size {}", root, g.size);
  }
  Descriptor d;
  d.op = kBroadcast;
  d.dtype = static_cast<uint32_t>(tensor.scalar_type());
  d.numel = tensor.numel();
  d.root = root;
  const Impl::Path path = g.pathFor(tensor.nbytes());
  at::Tensor target = tensor;
  return g.enqueue(
      d, summarize(tensor, fmt::format("root {}", root).c_str()), timeout, path,
      [g = &g, path, target, root](const Descriptor& d, Deadline deadline) mutable {
        const int rank = g->rank;
        if (path == Impl::Path::Local) return;
        at::Tensor host = hostView(target);
        const size_t bytes = host.nbytes();
        if (path == Impl::Path::Shm) {
          g->shm->broadcast(d, host, root, deadline);
        } else if (path == Impl::Path::Frame) {
          auto frames =
              g->frames->exchange(d, rank == root ? host.data_ptr() : nullptr, rank == root ? bytes : 0, deadline);
          if (rank != root && bytes) std::memcpy(host.data_ptr(), frames[root], bytes);
        } else {
          g->frames->exchange(d, nullptr, 0, deadline);
          g->ring->broadcast(static_cast<uint8_t*>(host.data_ptr()), bytes, root, deadline);
        }
        if (!host.is_same(target)) target.copy_(host);
      });
}

}  // namespace ddp::gloo_backend::collectives
