// Ring: ProcessGroupGloo's pipelined ring reduce-scatter (and allreduce)
// over Gloo's unbound buffers, for payloads too large for a frame.
//
// The data is split into one block per rank; block b spans elements
// [b*count/n, (b+1)*count/n). Blocks travel to the right neighbour in
// chunks of ringChunkBytes() (DDP_GLOO_CHUNK_BYTES), each chunk sent on as
// soon as it is reduced, so reduction overlaps transfer. Every receive is
// posted first, so no send waits for a "ready" round trip. The worker
// thread's only: not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backends/gloo/host_tensors.hpp"

namespace gloo {
class Context;
}

namespace ddp::gloo_backend {

// Pipelining granularity of the ring: large enough to amortize a message,
// small enough that reduction overlaps transfer (measured:
// docs/performance.md). 512 KiB, or DDP_GLOO_CHUNK_BYTES; throws
// UsageError when that is not a number > 0.
size_t ringChunkBytes();

class Ring {
 public:
  // `context` must outlive the ring.
  Ring(::gloo::Context& context, int rank, int size) : context_(context), rank_(rank), size_(size) {}

  // Reduces `count` elements of `dtype` at `data` in place with `reduceOp`
  // (ReduceOp's number; Avg sums): afterwards rank r holds the reduction of
  // block r. With thenAllgather the reduced blocks travel on around the
  // ring, so every rank holds all of them (allreduce).
  void reduceScatter(uint8_t* data, size_t count, size_t elementSize, int reduceOp, int dtype, uint64_t seq,
                     Deadline deadline, bool thenAllgather);

 private:
  ::gloo::Context& context_;
  int rank_, size_;
  std::vector<uint8_t> scratch_;  // receive space, reused
};

}  // namespace ddp::gloo_backend
