// The TCPStore client: a pool of authenticated connections to one server,
// through which every request of a TCPStore travels.
//
// Contract
// - The constructor opens the first connection, retrying until
//   `connectTimeout`, so that a wrong address or token fails at once with
//   StoreError naming host:port (a refused handshake is final, not retried).
// - One request is in flight per connection; a request borrows an idle
//   connection or opens another, so a get() blocked in one thread never
//   holds up a set() from another thread.
// - A request that outlives its timeout throws StoreTimeout and closes its
//   connection, which drops its waiter on the server. A lost connection
//   throws StoreError, and so does every later request: the server is gone.
// - kError replies throw StoreError with the server's message.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "framework/store/store.hpp"

namespace ddp::tcpstore {

class Client {
 public:
  Client(std::string host, uint16_t port, std::string token, std::chrono::milliseconds connectTimeout);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Sends one request (wire.hpp's Command) and returns the reply's body.
  Bytes request(uint8_t command, const std::vector<std::string>& keys, const Bytes& value,
                std::chrono::milliseconds timeout);

  // "tcp://host:port"
  std::string describe() const;

 private:
  struct Connected {
    int fd;
    int attempts;
  };
  Connected connect();
  int borrow();
  void giveBack(int fd);
  std::string hostPort() const;

  const std::string host_;
  const uint16_t port_;
  const std::string token_;
  const std::chrono::milliseconds connectTimeout_;
  std::mutex mutex_;
  std::vector<int> idle_;   // connections no request is using
  std::string lostReason_;  // why the server went away; "" while it is up
};

}  // namespace ddp::tcpstore
