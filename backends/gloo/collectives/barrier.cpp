// barrier: through shared memory (one step), or the frame exchange itself
// when every rank frames every other; beyond
// FrameExchange::kAllToAllMaxRanks frames go around the ring, so the
// ring's barrier follows them.
#include "backends/gloo/collectives/collectives.hpp"
#include "backends/gloo/impl.hpp"

namespace ddp::gloo_backend::collectives {

WorkPtr barrier(Impl& g, Milliseconds timeout) {
  Descriptor d;
  d.op = kBarrier;
  const Impl::Path path = g.pathFor(0);
  return g.enqueue(d, "no data", timeout, path, [g = &g, path](const Descriptor& d, Deadline deadline) {
    if (path == Impl::Path::Local) return;
    if (path == Impl::Path::Shm) {
      g->shm->barrier(d, deadline);
      return;
    }
    g->frames->exchange(d, nullptr, 0, deadline);
    if (path == Impl::Path::Large) g->ring->barrier(deadline);
  });
}

}  // namespace ddp::gloo_backend::collectives
