// The ring's reduce-scatter, and allreduce (reduce-scatter, then the
// reduced blocks once more around the ring).
#include "backends/gloo/ring.hpp"

namespace ddp::gloo_backend {

void Ring::reduceScatter(const uint8_t* input, uint8_t* work, uint8_t* output, size_t count, size_t elementSize,
                         int reduceOp, int dtype, Deadline deadline, bool thenAllgather) {
  const int n = links_->size(), rank = links_->rank();
  // Chunks are received and reduced one at a time, in stream order, so one
  // chunk of receive space, which stays in cache, serves them all.
  const size_t chunkBytes = std::max<size_t>(1, ringChunkBytes() / elementSize) * elementSize;
  if (scratch_.size() < chunkBytes) scratch_.resize(chunkBytes);
  uint8_t* tmp = scratch_.data();
  auto mod = [n](int b) { return ((b % n) + n) % n; };
  auto begin = [&](int b) { return static_cast<size_t>(b) * count / n; };
  auto end = [&](int b) { return static_cast<size_t>(b + 1) * count / n; };

  // Reduce-scatter step s brings block r-s-2 (the left's partial sum),
  // which goes on at step s+1; after the last step block r is reduced and,
  // for allreduce, starts the allgather, whose step s brings block r-s-1.
  // A block is received into only after this rank sent its own
  // contribution to it, so no region is overwritten before it has left.
  // Out of place, each chunk's own contribution is copied from `input`
  // just before the received one is added to it (the chunk is then in
  // cache), not the whole input up front; the last step's sums go straight
  // to `output`.
  std::vector<Incoming> incoming;
  for (int s = 0; s < n - 1; ++s) {
    const bool last = s == n - 2;
    const bool forward = !last || thenAllgather;
    forChunks(begin(mod(rank - s - 2)), end(mod(rank - s - 2)), elementSize, [&](size_t at, size_t len) {
      uint8_t* home = last && output ? output + (at - begin(rank)) * elementSize : work + at * elementSize;
      const uint8_t* own = input + at * elementSize;
      incoming.push_back({tmp, len * elementSize, home, forward ? home : nullptr, "reduce-scatter",
                          own != home ? own : nullptr});
    });
  }
  if (thenAllgather) {
    for (int s = 0; s < n - 1; ++s) {
      forChunks(begin(mod(rank - s - 1)), end(mod(rank - s - 1)), elementSize, [&](size_t at, size_t len) {
        uint8_t* home = work + at * elementSize;
        incoming.push_back({home, len * elementSize, nullptr, s < n - 2 ? home : nullptr, "allgather"});
      });
    }
  }
  // The stream to the right starts with this rank's own block r-1, whole.
  std::deque<Outgoing> outgoing;
  const int first = mod(rank - 1);
  if (end(first) > begin(first)) {
    outgoing.push_back({input + begin(first) * elementSize, (end(first) - begin(first)) * elementSize});
  }
  stream(incoming, std::move(outgoing), reduceFnFor(static_cast<at::ScalarType>(dtype)), reduceOp, elementSize,
         deadline);
}

}  // namespace ddp::gloo_backend
