#include "backends/gloo/ring.hpp"

#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <stdexcept>
#include <string>

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

namespace {

// A chunk of the stream from the left: where it lands, whether it is added
// into `data` (reduce-scatter) or stored there (allgather), and whether it
// then goes on to the right.
struct Incoming {
  size_t offset, bytes;
  bool reduce, forward;
};

// A stretch of `data` to send to the right.
struct Outgoing {
  size_t offset, bytes;
};

}  // namespace

void Ring::reduceScatter(uint8_t* data, size_t count, size_t elementSize, int reduceOp, int dtype, Deadline deadline,
                         bool thenAllgather) {
  const int n = links_->size(), rank = links_->rank();
  const int left = links_->left(), right = links_->right();
  const size_t bytes = count * elementSize;
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  uint8_t* tmp = scratch_.data();
  const ReduceFn reduce = reduceFnFor(static_cast<at::ScalarType>(dtype));
  const size_t chunkElems = std::max<size_t>(1, ringChunkBytes() / elementSize);

  auto mod = [n](int b) { return ((b % n) + n) % n; };
  auto blockBegin = [&](int b) { return static_cast<size_t>(b) * count / n; };
  auto blockEnd = [&](int b) { return static_cast<size_t>(b + 1) * count / n; };

  // The stream from the left, in order. Reduce-scatter step s brings block
  // r-s-2, which goes on at step s+1 (after the last step, block r, fully
  // reduced, starts the allgather); allgather step s brings block r-s-1.
  std::vector<Incoming> incoming;
  for (int s = 0; s < n - 1; ++s) {
    const int b = mod(rank - s - 2);
    const bool forward = s < n - 2 || thenAllgather;
    for (size_t at = blockBegin(b), end = blockEnd(b); at < end; at += chunkElems) {
      incoming.push_back({at * elementSize, std::min(chunkElems, end - at) * elementSize, true, forward});
    }
  }
  if (thenAllgather) {
    for (int s = 0; s < n - 1; ++s) {
      const int b = mod(rank - s - 1);
      for (size_t at = blockBegin(b), end = blockEnd(b); at < end; at += chunkElems) {
        incoming.push_back({at * elementSize, std::min(chunkElems, end - at) * elementSize, false, s < n - 2});
      }
    }
  }
  // The stream to the right starts with our own block r-1, whole.
  std::deque<Outgoing> outgoing;
  {
    const int b = mod(rank - 1);
    const size_t length = (blockEnd(b) - blockBegin(b)) * elementSize;
    if (length > 0) outgoing.push_back({blockBegin(b) * elementSize, length});
  }

  const int out = links_->toRight(), in = links_->fromLeft();
  size_t inIndex = 0, inDone = 0, outDone = 0;
  auto failed = [&](int peer, const char* phase, const std::string& why) {
    throw std::runtime_error(fmt::format("the connection to rank {} failed (the ring's {}): {}", peer, phase, why));
  };
  auto phase = [&] {
    return inIndex < incoming.size() && !incoming[inIndex].reduce ? "allgather" : "reduce-scatter";
  };
  while (inIndex < incoming.size() || !outgoing.empty()) {
    bool moved = false;
    while (!outgoing.empty()) {
      const Outgoing& o = outgoing.front();
      const ssize_t sent = ::send(out, data + o.offset + outDone, o.bytes - outDone, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (sent > 0) {
        moved = true;
        outDone += static_cast<size_t>(sent);
        if (outDone == o.bytes) {
          outgoing.pop_front();
          outDone = 0;
        }
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        break;
      } else if (errno != EINTR) {
        failed(right, phase(), std::strerror(errno));
      }
    }
    while (inIndex < incoming.size()) {
      const Incoming& c = incoming[inIndex];
      uint8_t* target = (c.reduce ? tmp : data) + c.offset;
      const ssize_t got = ::recv(in, target + inDone, c.bytes - inDone, MSG_DONTWAIT);
      if (got > 0) {
        moved = true;
        inDone += static_cast<size_t>(got);
        if (inDone < c.bytes) continue;
        if (c.reduce) reduce(data + c.offset, tmp + c.offset, c.bytes / elementSize, reduceOp);
        if (c.forward) outgoing.push_back({c.offset, c.bytes});
        ++inIndex;
        inDone = 0;
      } else if (got == 0) {
        failed(left, phase(), "the connection was closed");
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        break;
      } else if (errno != EINTR) {
        failed(left, phase(), std::strerror(errno));
      }
    }
    if (moved) continue;
    // Neither direction can move: wait for one that can.
    pollfd waits[2];
    nfds_t count = 0;
    if (!outgoing.empty()) waits[count++] = {out, POLLOUT, 0};
    if (inIndex < incoming.size()) waits[count++] = {in, POLLIN, 0};
    const auto left_ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left_ms <= 0 || ::poll(waits, count, static_cast<int>(std::min<long long>(left_ms + 1, 1 << 30))) == 0) {
      // Waiting for data from the left, or for the right to take ours.
      const int peer = inIndex < incoming.size() ? left : right;
      throw std::runtime_error(fmt::format("rank {} did not arrive before the timeout (the ring's {})", peer, phase()));
    }
  }
}

}  // namespace ddp::gloo_backend
