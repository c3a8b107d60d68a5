#include "backends/gloo/ring.hpp"

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <cstdlib>
#include <memory>

#include "backends/gloo/peer_wait.hpp"
#include "backends/gloo/slots.hpp"
#include "framework/core/errors.hpp"

namespace ddp::gloo_backend {

size_t ringChunkBytes() {
  static const size_t bytes = [] {
    const size_t fallback = size_t(512) * 1024;
    const char* env = std::getenv("DDP_GLOO_CHUNK_BYTES");
    if (env == nullptr || *env == '\0') return fallback;
    char* end = nullptr;
    const long long v = std::strtoll(env, &end, 10);
    if (*end != '\0' || v <= 0) {
      fail<UsageError>("DDP_GLOO_CHUNK_BYTES=\"{}\": expected a number of bytes > 0. HINT: unset it for the "
                       "default, {}",
                       env, fallback);
    }
    return static_cast<size_t>(v);
  }();
  return bytes;
}

void Ring::reduceScatter(uint8_t* data, size_t count, size_t elementSize, int reduceOp, int dtype, uint64_t seq,
                         Deadline deadline, bool thenAllgather) {
  const int n = size_;
  const int right = (rank_ + 1) % n;
  const int left = (rank_ + n - 1) % n;
  const size_t bytes = count * elementSize;
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  uint8_t* tmp = scratch_.data();
  const ReduceFn reduce = reduceFnFor(static_cast<at::ScalarType>(dtype));
  const size_t chunkElems = std::max<size_t>(1, ringChunkBytes() / elementSize);

  auto mod = [n](int b) { return ((b % n) + n) % n; };
  auto blockBegin = [&](int b) { return static_cast<size_t>(b) * count / n; };
  auto blockEnd = [&](int b) { return static_cast<size_t>(b + 1) * count / n; };
  // Calls fn(offsetElems, lengthElems) for each chunk of block b, in order.
  auto forChunks = [&](int b, auto&& fn) {
    for (size_t at = blockBegin(b), end = blockEnd(b); at < end; at += chunkElems) {
      fn(at, std::min(chunkElems, end - at));
    }
  };

  auto scatterIn = context_.createUnboundBuffer(tmp, bytes);   // partial sums from the left
  auto scatterOut = context_.createUnboundBuffer(data, bytes);  // our partial sums, to the right
  std::unique_ptr<::gloo::transport::UnboundBuffer> gatherIn, gatherOut;
  const uint64_t scatterSlot = slotFor(seq, kScatterPhase);
  const uint64_t gatherSlot = slotFor(seq, kGatherPhase);
  size_t scatterSends = 0, gatherSends = 0;

  // Post every receive first, so that no send waits for a "ready" round trip.
  for (int s = 0; s < n - 1; ++s) {
    forChunks(mod(rank_ - s - 2), [&](size_t at, size_t len) {
      scatterIn->recv(left, scatterSlot, at * elementSize, len * elementSize);
    });
  }
  if (thenAllgather) {
    gatherIn = context_.createUnboundBuffer(data, bytes);
    gatherOut = context_.createUnboundBuffer(data, bytes);
    for (int s = 0; s < n - 1; ++s) {
      forChunks(mod(rank_ - s - 1), [&](size_t at, size_t len) {
        gatherIn->recv(left, gatherSlot, at * elementSize, len * elementSize);
      });
    }
  }
  forChunks(mod(rank_ - 1), [&](size_t at, size_t len) {
    scatterOut->send(right, scatterSlot, at * elementSize, len * elementSize);
    ++scatterSends;
  });
  // Reduce-scatter: what arrives at step s is block r-s-2, which we send on
  // at step s+1, chunk by chunk, as soon as it is reduced.
  for (int s = 0; s < n - 1; ++s) {
    const bool last = s == n - 2;
    forChunks(mod(rank_ - s - 2), [&](size_t at, size_t len) {
      waitRecvFrom(*scatterIn, left, deadline, "the ring's reduce-scatter");
      reduce(data + at * elementSize, tmp + at * elementSize, len, reduceOp);
      if (!last) {
        scatterOut->send(right, scatterSlot, at * elementSize, len * elementSize);
        ++scatterSends;
      } else if (thenAllgather) {
        gatherOut->send(right, gatherSlot, at * elementSize, len * elementSize);
        ++gatherSends;
      }
    });
  }
  // Allgather: what arrives at step s is block r-s-1, forwarded at step s+1.
  if (thenAllgather) {
    for (int s = 0; s < n - 1; ++s) {
      const bool last = s == n - 2;
      forChunks(mod(rank_ - s - 1), [&](size_t at, size_t len) {
        waitRecvFrom(*gatherIn, left, deadline, "the ring's allgather");
        if (!last) {
          gatherOut->send(right, gatherSlot, at * elementSize, len * elementSize);
          ++gatherSends;
        }
      });
    }
  }
  for (size_t i = 0; i < scatterSends; ++i) scatterOut->waitSend(remaining(deadline));
  for (size_t i = 0; i < gatherSends; ++i) gatherOut->waitSend(remaining(deadline));
}

}  // namespace ddp::gloo_backend
