// Ring: ProcessGroupGloo's algorithms for payloads too large for a frame,
// over the rank's own two ring connections (framework/comm/links.hpp, Shape::Ring), not Gloo's
// pairs: reduce-scatter and allreduce (ring_reduce_scatter.cpp), allgather
// (ring_allgather.cpp), a pipelined chain broadcast (ring_broadcast.cpp)
// and a barrier (ring_barrier.cpp).
//
// Each algorithm is a plan for one stream engine (ring.cpp). What comes from
// the left is one byte stream whose order both sides know, a list of
// chunks, so it needs no headers: the collective's frame exchange has
// already checked that every rank runs the same collective with the same
// count. Each arriving chunk may be added into the data (reduction) and may
// then be sent on to the right, so reduction and forwarding overlap the
// transfer at ringChunkBytes() (DDP_GLOO_CHUNK_BYTES). One thread drives
// both directions with non-blocking sends and receives and waits in poll()
// only when neither can move: no transport thread hands the bytes over,
// and no "ready to receive" message precedes them. The worker thread's
// only: not thread-safe (interrupt() excepted).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "backends/gloo/host_tensors.hpp"
#include "framework/comm/links.hpp"

namespace ddp::gloo_backend {

// Pipelining granularity of the ring: large enough to amortize a message,
// small enough that reduction overlaps transfer (measured:
// docs/performance.md). 512 KiB, or DDP_GLOO_CHUNK_BYTES; throws
// UsageError when that is not a number > 0.
size_t ringChunkBytes();

class Ring {
 public:
  explicit Ring(std::unique_ptr<Links> links) : links_(std::move(links)) {}

  // Errors of every algorithm: a neighbour that neither sends nor takes
  // bytes by the deadline throws std::runtime_error "rank P did not arrive
  // before the timeout (the ring's PHASE)", a broken connection "the
  // connection to rank P failed (the ring's PHASE): <reason>"; after
  // interrupt(), "interrupted (the ring's PHASE): the group was aborted".

  // Reduces `count` elements of `dtype` at `input` with `reduceOp`
  // (ReduceOp's number; Avg sums), block r of them, elements
  // [r*count/n, (r+1)*count/n), for rank r. Partial sums are kept in `work`
  // (count elements, at the same offsets; it may be `input`, which is then
  // overwritten), the reduced block r goes to `output`, or with `output`
  // null stays in `work`. With thenAllgather (work == input, output null)
  // the reduced blocks travel on around the ring, so every rank holds all
  // of them in `work` (allreduce). `output` may be input's block r, and
  // must not overlap the rest of it.
  void reduceScatter(const uint8_t* input, uint8_t* work, uint8_t* output, size_t count, size_t elementSize,
                     int reduceOp, int dtype, Deadline deadline, bool thenAllgather);
  // Every rank's `bytes` at `input` into `output` (size x bytes, in rank
  // order); `input` may be this rank's slot of `output`.
  void allgather(const uint8_t* input, uint8_t* output, size_t bytes, Deadline deadline);
  // `bytes` at `data` from `root` to every rank, along the ring from the
  // root to its left neighbour, chunk by chunk.
  void broadcast(uint8_t* data, size_t bytes, int root, Deadline deadline);

  // Returns once every rank has called it: a token twice around the ring.
  void barrier(Deadline deadline);

  // From any thread: a running or later algorithm fails at once.
  void interrupt() { links_->interrupt(); }
  // On the thread that runs collectives, after one failed: Links::reset().
  void reset() { links_->reset(); }

 private:
  // A chunk of the stream from the left: it lands at `into`; if
  // `reduceInto` is set, it is then added into it (after `seed` is copied
  // there, if set: this rank's own contribution); if `forward` is set,
  // `bytes` from there go on to the right. `phase` names it in errors.
  // Chunks are received one after another, each handled before the next
  // begins, so chunks that are reduced may share one `into`.
  struct Incoming {
    uint8_t* into;
    size_t bytes;
    uint8_t* reduceInto;
    const uint8_t* forward;
    const char* phase;
    const uint8_t* seed = nullptr;  // if set, copied into reduceInto first
  };
  // Bytes to send to the right, in order.
  struct Outgoing {
    const uint8_t* from;
    size_t bytes;
  };
  // Runs a plan: sends `outgoing` (and each forwarded chunk after it) while
  // it receives `incoming`, until both are done.
  void stream(const std::vector<Incoming>& incoming, std::deque<Outgoing> outgoing, ReduceFn reduce, int reduceOp,
              size_t elementSize, Deadline deadline);
  // Calls fn(offsetElems, lengthElems) for each ringChunkBytes() piece of
  // elements [begin, end).
  template <typename Fn>
  static void forChunks(size_t begin, size_t end, size_t elementSize, Fn&& fn) {
    const size_t chunk = std::max<size_t>(1, ringChunkBytes() / elementSize);
    for (size_t at = begin; at < end; at += chunk) fn(at, std::min(chunk, end - at));
  }

  std::unique_ptr<Links> links_;
  std::vector<uint8_t> scratch_;  // receive space for one chunk of a reduction, reused
};

}  // namespace ddp::gloo_backend
