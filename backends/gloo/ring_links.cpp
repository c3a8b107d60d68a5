#include "backends/gloo/ring_links.hpp"

#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <stdexcept>

#include "framework/core/system.hpp"
#include "framework/store/store.hpp"
#include "framework/store/tcp/socket.hpp"

namespace ddp::gloo_backend {
namespace {

using tcpstore::Clock;

constexpr uint32_t kMagic = 0x52494e47;  // "RING"
constexpr size_t kNonceHexBytes = 32;

// What a connecting rank sends first.
struct Hello {
  uint32_t magic;
  int32_t rank;
  char nonce[kNonceHexBytes];
};

}  // namespace

RingLinks::RingLinks(Store& store, int rank, int size, const std::string& address, std::chrono::milliseconds timeout)
    : rank_(rank), size_(size) {
  const auto deadline = Clock::now() + timeout;
  auto failWith = [&](const std::string& what) {
    tcpstore::closeFd(toRight_);
    tcpstore::closeFd(fromLeft_);
    throw std::runtime_error(fmt::format("the ring's connections: {}", what));
  };

  tcpstore::AddrInfoList here;
  std::string error = tcpstore::resolve(address, 0, /*passive=*/true, &here);
  if (!error.empty()) failWith(fmt::format("cannot resolve {}: {}", address, error));
  int err = 0;
  const int listener = tcpstore::listenOn(*here.list, &err);
  if (listener < 0) failWith(fmt::format("cannot listen on {}: {}", address, std::strerror(err)));
  const std::string nonce = randomHex(kNonceHexBytes / 2);
  store.setString(fmt::format("ring/{}", rank_),
                  fmt::format("{} {} {}", tcpstore::boundPort(listener), nonce, address));

  try {
    // To the right: its listener's backlog completes the connection even
    // before it accepts, so every rank can connect first, then accept.
    std::istringstream published(store.getString(fmt::format("ring/{}", right())));
    uint16_t port = 0;
    std::string theirNonce, theirAddress;
    published >> port >> theirNonce >> theirAddress;
    tcpstore::AddrInfoList there;
    error = tcpstore::resolve(theirAddress, port, /*passive=*/false, &there);
    if (error.empty()) toRight_ = tcpstore::connectTo(*there.list, deadline, &error);
    if (toRight_ < 0) {
      failWith(fmt::format("cannot connect to rank {} at {}: {}", right(), tcpstore::formatHostPort(theirAddress, port),
                           error));
    }
    Hello hello{kMagic, rank_, {}};
    std::memcpy(hello.nonce, theirNonce.data(), std::min(theirNonce.size(), kNonceHexBytes));
    tcpstore::sendAll(toRight_, std::string(reinterpret_cast<const char*>(&hello), sizeof hello), deadline);

    // From the left: the first connection that proves to be it.
    while (fromLeft_ < 0) {
      if (!tcpstore::waitReady(listener, POLLIN, deadline)) {
        failWith(fmt::format("rank {} did not connect before the timeout", left()));
      }
      const int fd = ::accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) continue;
      Hello theirs{};
      try {
        // A stranger that says nothing is given a few seconds at most.
        const auto helloDeadline = std::min(deadline, Clock::now() + std::chrono::seconds(5));
        tcpstore::recvAll(fd, reinterpret_cast<char*>(&theirs), sizeof theirs, helloDeadline);
      } catch (const tcpstore::IoTimeout&) {
        tcpstore::closeFd(fd);
        continue;
      } catch (const tcpstore::ConnectionLost&) {
        tcpstore::closeFd(fd);
        continue;
      }
      if (theirs.magic != kMagic || theirs.rank != left() ||
          std::string(theirs.nonce, kNonceHexBytes) != nonce.substr(0, kNonceHexBytes)) {
        tcpstore::closeFd(fd);
        continue;
      }
      tcpstore::setNoDelay(fd);
      fromLeft_ = fd;
    }
  } catch (const tcpstore::IoTimeout&) {
    tcpstore::closeFd(listener);
    failWith(fmt::format("rank {} did not answer before the timeout", right()));
  } catch (const tcpstore::ConnectionLost& e) {
    tcpstore::closeFd(listener);
    failWith(fmt::format("the connection to rank {} broke: {}", right(), e.reason));
  } catch (...) {
    tcpstore::closeFd(listener);
    throw;
  }
  tcpstore::closeFd(listener);
}

RingLinks::~RingLinks() {
  tcpstore::closeFd(toRight_);
  tcpstore::closeFd(fromLeft_);
}

void RingLinks::interrupt() {
  if (toRight_ >= 0) ::shutdown(toRight_, SHUT_RDWR);
  if (fromLeft_ >= 0) ::shutdown(fromLeft_, SHUT_RDWR);
}

}  // namespace ddp::gloo_backend
