// Ring: ProcessGroupGloo's pipelined ring reduce-scatter (and allreduce)
// for payloads too large for a frame, over the rank's own two ring
// connections (ring_links.hpp), not Gloo's pairs.
//
// The data is split into one block per rank; block b spans elements
// [b*count/n, (b+1)*count/n). Blocks travel to the right neighbour in
// chunks of ringChunkBytes() (DDP_GLOO_CHUNK_BYTES), each chunk sent on as
// soon as it is reduced, so reduction overlaps transfer. What comes from
// the left is one byte stream whose order both sides know (the
// reduce-scatter's blocks, then the allgather's), so it needs no headers;
// the collective's frame exchange has already checked that every rank runs
// the same collective. One thread drives both directions with
// non-blocking sends and receives and waits in poll() only when neither can
// move. The worker thread's only: not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "backends/gloo/host_tensors.hpp"
#include "backends/gloo/ring_links.hpp"

namespace ddp::gloo_backend {

// Pipelining granularity of the ring: large enough to amortize a message,
// small enough that reduction overlaps transfer (measured:
// docs/performance.md). 512 KiB, or DDP_GLOO_CHUNK_BYTES; throws
// UsageError when that is not a number > 0.
size_t ringChunkBytes();

class Ring {
 public:
  explicit Ring(std::unique_ptr<RingLinks> links) : links_(std::move(links)) {}

  // Reduces `count` elements of `dtype` at `data` in place with `reduceOp`
  // (ReduceOp's number; Avg sums): afterwards rank r holds the reduction of
  // block r. With thenAllgather the reduced blocks travel on around the
  // ring, so every rank holds all of them (allreduce). A neighbour that
  // neither sends nor receives by the deadline throws std::runtime_error
  // "rank P did not arrive before the timeout (...)", a broken connection
  // "the connection to rank P failed (...): <reason>".
  void reduceScatter(uint8_t* data, size_t count, size_t elementSize, int reduceOp, int dtype, Deadline deadline,
                     bool thenAllgather);
  // From any thread: a running or later reduceScatter fails at once.
  void interrupt() { links_->interrupt(); }

 private:
  std::unique_ptr<RingLinks> links_;
  std::vector<uint8_t> scratch_;  // receive space, reused
};

}  // namespace ddp::gloo_backend
