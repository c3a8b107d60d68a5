// The ring's broadcast: a chain from the root to its left neighbour, each
// rank passing every chunk on as soon as it has it. For large messages the
// root sends the data once instead of once per rank.
#include "backends/gloo/ring.hpp"

namespace ddp::gloo_backend {

void Ring::broadcast(uint8_t* data, size_t bytes, int root, Deadline deadline) {
  const int n = links_->size(), rank = links_->rank();
  if (bytes == 0) return;
  const int position = ((rank - root) % n + n) % n;  // 0: the root; n-1: the chain's end
  std::vector<Incoming> incoming;
  std::deque<Outgoing> outgoing;
  if (position == 0) {
    outgoing.push_back({data, bytes});
  } else {
    forChunks(0, bytes, 1, [&](size_t at, size_t len) {
      incoming.push_back({data + at, len, nullptr, position < n - 1 ? data + at : nullptr, "broadcast"});
    });
  }
  stream(incoming, std::move(outgoing), nullptr, 0, 1, deadline);
}

}  // namespace ddp::gloo_backend
