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

void Ring::stream(const std::vector<Incoming>& incoming, std::deque<Outgoing> outgoing, ReduceFn reduce,
                  int reduceOp, size_t elementSize, Deadline deadline) {
  const int left = links_->left(), right = links_->right();
  const int out = links_->to(right), in = links_->from(left);
  size_t inIndex = 0, inDone = 0, outDone = 0;
  const char* lastPhase = incoming.empty() ? "send" : incoming.back().phase;
  auto phase = [&] { return inIndex < incoming.size() ? incoming[inIndex].phase : lastPhase; };
  auto failed = [&](int peer, const std::string& why) {
    if (links_->interrupted()) {
      throw std::runtime_error(fmt::format("interrupted (the ring's {}): the group was aborted", phase()));
    }
    throw std::runtime_error(fmt::format("the connection to rank {} failed (the ring's {}): {}", peer, phase(), why));
  };
  while (inIndex < incoming.size() || !outgoing.empty()) {
    bool moved = false;
    while (!outgoing.empty()) {
      const Outgoing& o = outgoing.front();
      const ssize_t sent = ::send(out, o.from + outDone, o.bytes - outDone, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (sent > 0) {
        moved = true;
        outDone += static_cast<size_t>(sent);
        if (outDone == o.bytes) {
          outgoing.pop_front();
          outDone = 0;
        }
      } else if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        break;
      } else if (sent == 0 || errno != EINTR) {
        failed(right, sent == 0 ? "nothing could be sent" : std::strerror(errno));
      }
    }
    while (inIndex < incoming.size()) {
      const Incoming& c = incoming[inIndex];
      const ssize_t got = ::recv(in, c.into + inDone, c.bytes - inDone, MSG_DONTWAIT);
      if (got > 0) {
        moved = true;
        inDone += static_cast<size_t>(got);
        if (inDone < c.bytes) continue;
        if (c.reduceInto) {
          if (c.seed && c.seed != c.reduceInto) std::memcpy(c.reduceInto, c.seed, c.bytes);
          reduce(c.reduceInto, c.into, c.bytes / elementSize, reduceOp);
        }
        ++inIndex;
        inDone = 0;
        if (c.forward) {
          outgoing.push_back({c.forward, c.bytes});
          break;  // send it on before reducing more
        }
      } else if (got == 0) {
        failed(left, "the connection was closed");
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        break;
      } else if (errno != EINTR) {
        failed(left, std::strerror(errno));
      }
    }
    if (moved) continue;
    // Neither direction can move: wait until one can.
    pollfd waits[2];
    nfds_t count = 0;
    if (!outgoing.empty()) waits[count++] = {out, POLLOUT, 0};
    if (inIndex < incoming.size()) waits[count++] = {in, POLLIN, 0};
    const long long waitMs = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    const int ready = waitMs <= 0 ? 0 : ::poll(waits, count, static_cast<int>(std::min<long long>(waitMs + 1, 1 << 30)));
    if (ready == 0) {
      // Waiting for bytes from the left, or for the right to take ours.
      const int peer = inIndex < incoming.size() ? left : right;
      throw std::runtime_error(fmt::format("rank {} did not arrive before the timeout (the ring's {})", peer, phase()));
    }
    if (ready < 0 && errno != EINTR) failed(inIndex < incoming.size() ? left : right, std::strerror(errno));
  }
}

}  // namespace ddp::gloo_backend
