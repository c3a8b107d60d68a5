// Socket plumbing for TCPStore: addresses, and blocking I/O with a deadline
// on non-blocking sockets.
//
// Contract
// - Nothing here throws StoreError: a deadline that passes throws IoTimeout,
//   a broken or closed connection throws ConnectionLost with the reason
//   ("Connection reset by peer"), and functions that can fail in the
//   ordinary course return the error as text. Callers word the message,
//   naming the store.
// - Every socket is non-blocking and close-on-exec; sends never raise
//   SIGPIPE.
#pragma once

#include <netdb.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <string>

namespace ddp::tcpstore {

using Clock = std::chrono::steady_clock;

struct IoTimeout {};
struct ConnectionLost {
  std::string reason;
};

// "host:port", with IPv6 literals in brackets ("[::1]:29500").
std::string formatHostPort(const std::string& host, uint16_t port);

// The addresses of one host:port, freed with the object.
struct AddrInfoList {
  addrinfo* list = nullptr;
  AddrInfoList() = default;
  AddrInfoList(const AddrInfoList&) = delete;
  AddrInfoList& operator=(const AddrInfoList&) = delete;
  ~AddrInfoList();
};

// Resolves host:port (IPv4 and IPv6); host "" means the wildcard address for
// a server (passive) and the loopback address for a client. Returns "" or
// the resolver's error text.
std::string resolve(const std::string& host, uint16_t port, bool passive, AddrInfoList* out);

// A socket listening on `address`; -1 with *err set to the errno otherwise.
int listenOn(const addrinfo& address, int* err);
// The port a socket is bound to.
uint16_t boundPort(int fd);
// The numeric host:port of an accepted peer.
std::string peerName(const sockaddr_storage& addr, socklen_t len);
// A socket connected to `address` by `deadline`, with Nagle off; -1 with
// *error set ("Connection refused") otherwise.
int connectTo(const addrinfo& address, Clock::time_point deadline, std::string* error);
void setNoDelay(int fd);

// Waits until fd is ready for `events` (POLLIN, POLLOUT); false once the
// deadline passes.
bool waitReady(int fd, short events, Clock::time_point deadline);
void sendAll(int fd, const std::string& data, Clock::time_point deadline);
void recvAll(int fd, char* buf, size_t len, Clock::time_point deadline);

// close(2) unless fd < 0.
void closeFd(int fd);

}  // namespace ddp::tcpstore
