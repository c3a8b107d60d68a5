#include "framework/comm/links.hpp"

#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <set>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "framework/core/system.hpp"
#include "framework/store/store.hpp"
#include "framework/store/tcp/socket.hpp"

namespace ddp {
namespace {

using tcpstore::Clock;

constexpr uint32_t kMagic = 0x4c4e4b31;  // "LNK1"
constexpr size_t kNonceHexBytes = 32;

// What a connecting rank sends first.
struct Hello {
  uint32_t magic;
  int32_t rank;
  char nonce[kNonceHexBytes];
};

// Closes a socket unless released.
struct FdGuard {
  int fd = -1;
  ~FdGuard() { tcpstore::closeFd(fd); }
  int release() { return std::exchange(fd, -1); }
};

std::chrono::milliseconds remainingUntil(Clock::time_point deadline) {
  return std::max(std::chrono::milliseconds(1),
                  std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
}

}  // namespace

Links::Links(Store& store, const std::string& name, Shape shape, int rank, int size, const std::string& address,
             std::chrono::milliseconds timeout)
    : rank_(rank), size_(size), to_(size, -1), from_(size, -1) {
  const auto deadline = Clock::now() + timeout;
  std::vector<int> connectTo;
  std::set<int> acceptFrom;
  if (shape == Shape::Ring) {
    connectTo = {right()};
    acceptFrom = {left()};
  } else {
    for (int p = 0; p < rank_; ++p) connectTo.push_back(p);
    for (int p = rank_ + 1; p < size_; ++p) acceptFrom.insert(p);
  }
  auto keyOf = [&](int r) { return fmt::format("{}/{}", name, r); };

  try {
    tcpstore::AddrInfoList here;
    std::string error = tcpstore::resolve(address, 0, /*passive=*/true, &here);
    if (!error.empty()) throw std::runtime_error(fmt::format("cannot resolve {}: {}", address, error));
    int err = 0;
    FdGuard listener{tcpstore::listenOn(*here.list, &err)};
    if (listener.fd < 0) throw std::runtime_error(fmt::format("cannot listen on {}: {}", address, std::strerror(err)));
    const std::string nonce = randomHex(kNonceHexBytes / 2);
    store.setString(keyOf(rank_), fmt::format("{} {} {}", tcpstore::boundPort(listener.fd), nonce, address));

    // Connect first: a peer's listener backlog completes the connection
    // before it accepts, so no order of ranks can wait on another.
    for (int peer : connectTo) {
      try {
        store.wait({keyOf(peer)}, remainingUntil(deadline));
      } catch (const StoreTimeout&) {
        throw std::runtime_error(fmt::format("rank {} did not publish its address before the timeout", peer));
      }
      std::istringstream published(store.getString(keyOf(peer)));
      uint16_t port = 0;
      std::string theirNonce, theirAddress;
      published >> port >> theirNonce >> theirAddress;
      tcpstore::AddrInfoList there;
      error = tcpstore::resolve(theirAddress, port, /*passive=*/false, &there);
      FdGuard fd;
      if (error.empty()) fd.fd = tcpstore::connectTo(*there.list, deadline, &error);
      if (fd.fd < 0) {
        throw std::runtime_error(fmt::format("cannot connect to rank {} at {}: {}", peer,
                                             tcpstore::formatHostPort(theirAddress, port), error));
      }
      Hello hello{kMagic, rank_, {}};
      std::memcpy(hello.nonce, theirNonce.data(), std::min(theirNonce.size(), kNonceHexBytes));
      try {
        tcpstore::sendAll(fd.fd, std::string(reinterpret_cast<const char*>(&hello), sizeof hello), deadline);
      } catch (const tcpstore::IoTimeout&) {
        throw std::runtime_error(fmt::format("rank {} did not take this rank's greeting before the timeout", peer));
      } catch (const tcpstore::ConnectionLost& e) {
        throw std::runtime_error(fmt::format("the connection to rank {} broke: {}", peer, e.reason));
      }
      to_[peer] = fd.release();
      if (shape == Shape::Mesh) from_[peer] = to_[peer];
    }

    // Then accept, until every expected peer has proved itself.
    while (!acceptFrom.empty()) {
      bool ready = false;
      try {
        ready = tcpstore::waitReady(listener.fd, POLLIN, deadline);
      } catch (const tcpstore::ConnectionLost& e) {
        throw std::runtime_error(fmt::format("waiting for connections on {}: {}", address, e.reason));
      }
      if (!ready) {
        std::string missing;
        for (int p : acceptFrom) missing += (missing.empty() ? "" : ", ") + std::to_string(p);
        throw std::runtime_error(fmt::format("rank(s) {} did not connect before the timeout", missing));
      }
      FdGuard fd{::accept4(listener.fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC)};
      if (fd.fd < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED || errno == EPROTO) {
          continue;
        }
        throw std::runtime_error(fmt::format("accepting a connection on {}: {}", address, std::strerror(errno)));
      }
      Hello theirs{};
      try {
        // A stranger that says nothing is given a few seconds at most.
        tcpstore::recvAll(fd.fd, reinterpret_cast<char*>(&theirs), sizeof theirs,
                          std::min(deadline, Clock::now() + std::chrono::seconds(5)));
      } catch (const tcpstore::IoTimeout&) {
        continue;
      } catch (const tcpstore::ConnectionLost&) {
        continue;
      }
      if (theirs.magic != kMagic || acceptFrom.count(theirs.rank) == 0 ||
          std::string(theirs.nonce, kNonceHexBytes) != nonce) {
        continue;  // not one of ours: dropped
      }
      acceptFrom.erase(theirs.rank);
      from_[theirs.rank] = fd.release();
      if (shape == Shape::Mesh) to_[theirs.rank] = from_[theirs.rank];
    }
  } catch (...) {
    closeAll();
    throw;
  }
  for (int p = 0; p < size_; ++p) {
    if (to_[p] >= 0) tcpstore::setNoDelay(to_[p]);
  }
}

Links::~Links() { closeAll(); }

void Links::closeAll() {
  for (int p = 0; p < size_; ++p) {
    if (from_[p] >= 0 && from_[p] != to_[p]) tcpstore::closeFd(from_[p]);
    tcpstore::closeFd(to_[p]);
    to_[p] = from_[p] = -1;
  }
}

void Links::reset() {
  interrupt();
  std::lock_guard<std::mutex> lock(mutex_);
  const linger abortive{1, 0};
  for (int p = 0; p < size_; ++p) {
    if (to_[p] >= 0) setsockopt(to_[p], SOL_SOCKET, SO_LINGER, &abortive, sizeof abortive);
    if (from_[p] >= 0) setsockopt(from_[p], SOL_SOCKET, SO_LINGER, &abortive, sizeof abortive);
  }
  closeAll();
}

void Links::interrupt() {
  interrupted_ = true;
  std::lock_guard<std::mutex> lock(mutex_);
  for (int p = 0; p < size_; ++p) {
    if (to_[p] >= 0) ::shutdown(to_[p], SHUT_RDWR);
    if (from_[p] >= 0) ::shutdown(from_[p], SHUT_RDWR);
  }
}

ssize_t sendSome(int fd, const void* data, size_t bytes, std::string* why) {
  iovec part{const_cast<void*>(data), bytes};
  return sendSomeParts(fd, &part, 1, why);
}

ssize_t sendSomeParts(int fd, const iovec* parts, int count, std::string* why) {
  msghdr message{};
  message.msg_iov = const_cast<iovec*>(parts);
  message.msg_iovlen = static_cast<size_t>(count);
  for (;;) {
    const ssize_t n = ::sendmsg(fd, &message, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) return n;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    if (n < 0 && errno == EINTR) continue;
    *why = n == 0 ? "nothing could be sent" : std::strerror(errno);
    return -1;
  }
}

ssize_t recvSome(int fd, void* data, size_t bytes, std::string* why) {
  for (;;) {
    const ssize_t n = ::recv(fd, data, bytes, MSG_DONTWAIT);
    if (n > 0) return n;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    if (n < 0 && errno == EINTR) continue;
    *why = n == 0 ? "the connection was closed" : std::strerror(errno);
    return -1;
  }
}

void transferAll(Links& links, std::vector<LinkTransfer>& sends, std::vector<LinkTransfer>& recvs,
                 std::chrono::steady_clock::time_point deadline, const std::string& what,
                 const std::function<void(int stage)>& afterStage) {
  std::vector<pollfd> waiting;
  std::vector<int> busyPeers;  // a peer whose earlier transfer in this pass is unfinished
  std::string why;
  const auto failed = [&](int peer) {
    if (links.interrupted()) throw std::runtime_error(fmt::format("interrupted ({}): the group was aborted", what));
    throw std::runtime_error(fmt::format("the connection to rank {} failed ({}): {}", peer, what, why));
  };
  int stage = 0;  // receives of this stage and below may move
  // A send that failed: the peer closed or reset the connection. Raised
  // only once the receives have run their course, so that what they say
  // (what is still in the kernel's buffer from that peer, the stages'
  // checks) comes first: a peer that found a mistake every rank sees and
  // closed is then reported as that mistake, not as a reset.
  std::string sendFailure;
  std::vector<int> deadPeers;
  // Moves each transfer of `list` until the kernel would block, then waits
  // for that socket to be ready for more. True when all are done.
  const auto advance = [&](std::vector<LinkTransfer>& list, bool sending) {
    bool all = true;
    busyPeers.clear();
    for (size_t k = 0; k < list.size(); ++k) {  // by index: afterStage may append
      LinkTransfer& t = list[k];
      if (t.done >= t.bytes) continue;
      if (sending && std::find(deadPeers.begin(), deadPeers.end(), t.peer) != deadPeers.end()) {
        t.done = t.bytes;  // abandoned: sendFailure says why
        continue;
      }
      all = false;
      if ((!sending && t.stage > stage) ||
          std::find(busyPeers.begin(), busyPeers.end(), t.peer) != busyPeers.end()) {
        continue;
      }
      const int fd = sending ? links.to(t.peer) : links.from(t.peer);
      uint8_t* data = static_cast<uint8_t*>(t.data);
      while (t.done < t.bytes) {
        const ssize_t n = sending ? sendSome(fd, data + t.done, t.bytes - t.done, &why)
                                  : recvSome(fd, data + t.done, t.bytes - t.done, &why);
        if (n < 0 && sending && !links.interrupted()) {
          if (sendFailure.empty()) {
            sendFailure = fmt::format("the connection to rank {} failed ({}): {}", t.peer, what, why);
          }
          deadPeers.push_back(t.peer);
          t.done = t.bytes;
          break;
        }
        if (n < 0) failed(t.peer);
        if (n == 0) {
          waiting.push_back({fd, static_cast<short>(sending ? POLLOUT : POLLIN), 0});
          break;
        }
        t.done += static_cast<size_t>(n);
      }
      if (t.done < t.bytes) busyPeers.push_back(t.peer);
    }
    return all;
  };
  // Whether every receive up to `stage` is done, and the last stage.
  const auto stageDone = [&] {
    for (const auto& t : recvs) {
      if (t.stage <= stage && t.done < t.bytes) return false;
    }
    return true;
  };
  const auto lastStage = [&] {
    int last = 0;
    for (const auto& t : recvs) last = std::max(last, t.stage);
    return last;
  };
  for (;;) {
    waiting.clear();
    bool sent = advance(sends, /*sending=*/true);
    advance(recvs, /*sending=*/false);
    // A stage that is in lets the next one move (afterStage may add
    // receives, and sends).
    while (stageDone() && stage <= lastStage()) {
      if (afterStage) afterStage(stage);
      ++stage;
      sent = advance(sends, /*sending=*/true);
      advance(recvs, /*sending=*/false);
    }
    if (sent && stage > lastStage()) {
      if (!sendFailure.empty()) throw std::runtime_error(sendFailure);
      return;
    }
    if (waiting.empty()) continue;
    const int ready = pollUntil(waiting.data(), waiting.size(), deadline);
    if (ready == 0) {
      const std::string also = sendFailure.empty() ? "" : "; before that, " + sendFailure;
      for (const auto& t : recvs) {
        if (t.done < t.bytes) {
          throw std::runtime_error(fmt::format(
              "rank {} did not send its bytes of {} before the timeout ({} of {} received){}", t.peer, what, t.done,
              t.bytes, also));
        }
      }
      for (const auto& t : sends) {
        if (t.done < t.bytes) {
          throw std::runtime_error(fmt::format("rank {} did not take its bytes of {} before the timeout ({} of {} sent)",
                                               t.peer, what, t.done, t.bytes));
        }
      }
    }
    if (ready < 0 && errno != EINTR) throw std::runtime_error(fmt::format("poll: {}", std::strerror(errno)));
  }
}

int pollUntil(pollfd* fds, size_t count, std::chrono::steady_clock::time_point deadline) {
  const long long waitMs =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
  if (waitMs <= 0) return 0;
  // One millisecond more: poll() rounds down, and the deadline must have passed.
  return ::poll(fds, static_cast<nfds_t>(count), static_cast<int>(std::min<long long>(waitMs + 1, 1 << 30)));
}

}  // namespace ddp
