#include "framework/store/tcp/socket.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "framework/core/system.hpp"

namespace ddp::tcpstore {

std::string formatHostPort(const std::string& host, uint16_t port) {
  // IPv6 literals need brackets, or the port reads as one more group.
  if (host.find(':') != std::string::npos) return fmt::format("[{}]:{}", host, port);
  return fmt::format("{}:{}", host, port);
}

AddrInfoList::~AddrInfoList() {
  if (list) freeaddrinfo(list);
}

std::string resolve(const std::string& host, uint16_t port, bool passive, AddrInfoList* out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;  // IPv4 and IPv6 alike
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  const std::string service = std::to_string(port);
  const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &out->list);
  if (rc == 0) return "";
  return rc == EAI_SYSTEM ? errnoText(errno) : gai_strerror(rc);
}

int listenOn(const addrinfo& address, int* err) {
  const int fd = ::socket(address.ai_family, address.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, address.ai_protocol);
  if (fd < 0) {
    *err = errno;
    return -1;
  }
  int one = 1;
  // Lets a restarted job rebind the port while old connections sit in TIME_WAIT.
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd, address.ai_addr, address.ai_addrlen) != 0 || ::listen(fd, SOMAXCONN) != 0) {
    *err = errno;
    ::close(fd);
    return -1;
  }
  return fd;
}

uint16_t boundPort(int fd) {
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  return ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                           : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
}

std::string peerName(const sockaddr_storage& addr, socklen_t len) {
  char host[NI_MAXHOST];
  char serv[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, host, sizeof host, serv, sizeof serv,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "(unknown peer)";
  }
  return formatHostPort(host, static_cast<uint16_t>(std::atoi(serv)));
}

int connectTo(const addrinfo& address, Clock::time_point deadline, std::string* error) {
  const int fd = ::socket(address.ai_family, address.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, address.ai_protocol);
  if (fd < 0) {
    *error = errnoText(errno);
    return -1;
  }
  // Non-blocking connect, so that an unreachable host cannot outlast the deadline.
  int err = 0;
  if (::connect(fd, address.ai_addr, address.ai_addrlen) != 0) {
    err = errno;
    if (err == EINPROGRESS || err == EINTR) {
      try {
        err = waitReady(fd, POLLOUT, deadline) ? 0 : ETIMEDOUT;
      } catch (const ConnectionLost&) {
        err = EIO;
      }
      socklen_t len = sizeof err;
      if (err == 0 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    }
  }
  if (err != 0) {
    *error = errnoText(err);
    ::close(fd);
    return -1;
  }
  setNoDelay(fd);
  return fd;
}

void setNoDelay(int fd) {
  int one = 1;
  // Requests are small and latency-bound; Nagle would hold them back.
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

bool waitReady(int fd, short events, Clock::time_point deadline) {
  while (true) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1 << 30)));
    if (rc > 0) return true;  // ready, or an error the next send/recv reports
    if (rc < 0 && errno != EINTR) throw ConnectionLost{fmt::format("poll: {}", errnoText(errno))};
  }
}

void sendAll(int fd, const std::string& data, Clock::time_point deadline) {
  size_t done = 0;
  while (done < data.size()) {
    // MSG_NOSIGNAL: a dead peer must surface as an error, not kill us with SIGPIPE.
    const ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!waitReady(fd, POLLOUT, deadline)) throw IoTimeout{};
    } else {
      throw ConnectionLost{n < 0 ? errnoText(errno) : "send returned 0"};
    }
  }
}

void recvAll(int fd, char* buf, size_t len, Clock::time_point deadline) {
  size_t done = 0;
  while (done < len) {
    const ssize_t n = ::recv(fd, buf + done, len - done, 0);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n == 0) {
      throw ConnectionLost{"the server closed the connection"};
    } else if (errno == EINTR) {
      continue;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!waitReady(fd, POLLIN, deadline)) throw IoTimeout{};
    } else {
      throw ConnectionLost{errnoText(errno)};
    }
  }
}

void closeFd(int fd) {
  if (fd >= 0) ::close(fd);
}

}  // namespace ddp::tcpstore
