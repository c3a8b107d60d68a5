// The TCPStore server: serves the key-value map to TCPStore clients from one
// event-loop thread (wire.hpp describes the protocol).
//
// Contract
// - The constructor binds and listens on host:port (port 0 picks a free one;
//   see port()), or throws StoreError: a port in use names the port and
//   MASTER_PORT, any other failure the address and MASTER_ADDR. Given a
//   `listenFd` that listens on `port` (any port when port is 0), it serves
//   that socket instead and owns it; an unusable one is left alone.
// - GET and WAIT on absent keys are answered only once the keys exist, so a
//   waiting client costs the server nothing but a table entry. Timeouts are
//   the client's business: a client that gives up closes its connection,
//   which drops its pending waiter. Replies on one connection go out in
//   request order.
// - A connection whose handshake carries another token, that sends garbage
//   or an oversized frame (over kMaxHandshakeFrame before the handshake,
//   kMaxFrame after it), or that sends no handshake within 5 s is refused
//   (the peer gets the reason, the refusal is counted); the other
//   connections are served on. The first 5 refusals are logged one warning
//   each, later ones as one summary line per 10 s. A refused handshake (no
//   token, another token, another protocol) is also stored under
//   kLastRefusalKey as "PEER: reason", so the job's ranks waiting in the
//   rendezvous can name it (launch/arrival.hpp).
// - At most 64 connections await their handshake at a time; another one
//   closes the oldest of them, so idle or rogue connections hold a bounded
//   number of file descriptors.
// - Nothing thrown while serving (std::bad_alloc included) leaves the server
//   thread: a failure on one connection closes that connection.
// - The destructor stops the thread and closes every connection.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace ddp::tcpstore {

inline constexpr const char* kLastRefusalKey = "ddp/store/last_refusal";

class Server {
 public:
  Server(const std::string& host, uint16_t port, std::string token, int listenFd = -1);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // The port actually bound.
  uint16_t port() const;
  // Connections refused so far.
  int64_t refused() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp::tcpstore
