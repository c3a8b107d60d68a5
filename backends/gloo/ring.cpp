#include "backends/gloo/ring.hpp"

#include <fmt/format.h>
#include <poll.h>

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
    std::string why;
    while (!outgoing.empty()) {
      const Outgoing& o = outgoing.front();
      const ssize_t sent = sendSome(out, o.from + outDone, o.bytes - outDone, &why);
      if (sent < 0) failed(right, why);
      if (sent == 0) break;
      moved = true;
      outDone += static_cast<size_t>(sent);
      if (outDone == o.bytes) {
        outgoing.pop_front();
        outDone = 0;
      }
    }
    while (inIndex < incoming.size()) {
      const Incoming& c = incoming[inIndex];
      const ssize_t got = recvSome(in, c.into + inDone, c.bytes - inDone, &why);
      if (got < 0) failed(left, why);
      if (got == 0) break;
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
    }
    if (moved) continue;
    // Neither direction can move: wait until one can.
    pollfd waits[2];
    size_t count = 0;
    if (!outgoing.empty()) waits[count++] = {out, POLLOUT, 0};
    if (inIndex < incoming.size()) waits[count++] = {in, POLLIN, 0};
    const int ready = pollUntil(waits, count, deadline);
    if (ready == 0) {
      // Waiting for bytes from the left, or for the right to take ours.
      const int peer = inIndex < incoming.size() ? left : right;
      throw std::runtime_error(fmt::format("rank {} did not arrive before the timeout (the ring's {})", peer, phase()));
    }
    if (ready < 0 && errno != EINTR) failed(inIndex < incoming.size() ? left : right, std::strerror(errno));
  }
}

}  // namespace ddp::gloo_backend
