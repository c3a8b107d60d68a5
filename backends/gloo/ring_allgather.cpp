// The ring's allgather: each rank's input goes around the ring once,
// forwarded chunk by chunk as it arrives.
#include <cstring>

#include "backends/gloo/ring.hpp"

namespace ddp::gloo_backend {

void Ring::allgather(const uint8_t* input, uint8_t* output, size_t bytes, Deadline deadline) {
  const int n = links_->size(), rank = links_->rank();
  if (bytes == 0) return;
  auto mod = [n](int b) { return ((b % n) + n) % n; };
  uint8_t* mine = output + static_cast<size_t>(rank) * bytes;
  if (mine != input) std::memmove(mine, input, bytes);
  // Step s brings rank r-s-1's input, which goes on unless it is the last.
  std::vector<Incoming> incoming;
  for (int s = 0; s < n - 1; ++s) {
    uint8_t* slot = output + static_cast<size_t>(mod(rank - s - 1)) * bytes;
    forChunks(0, bytes, 1, [&](size_t at, size_t len) {
      incoming.push_back({slot + at, len, nullptr, s < n - 2 ? slot + at : nullptr, "allgather"});
    });
  }
  stream(incoming, {{mine, bytes}}, nullptr, 0, 1, deadline);
}

}  // namespace ddp::gloo_backend
