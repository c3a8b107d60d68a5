// TCPStore: a Store served over TCP by one process (rank 0) and used by all.
//
// Contract (in addition to store.hpp)
// - The server binds host:port (port 0 picks a free one; see port()). A port
//   already in use fails at once with StoreError naming the port.
// - Clients connect with retries until `connectTimeout`, then fail with
//   StoreError naming host:port and the last socket error.
// - Every connection starts with a handshake that carries the job's token.
//   The server refuses a connection whose token differs, logs the refusal
//   to stderr, and keeps serving the others. The token comes from
//   DDP_STORE_TOKEN unless given explicitly; `ddp-run` generates one for
//   the ranks it spawns.
// - A server that goes away makes pending calls fail with StoreError rather
//   than block.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "framework/store/store.hpp"

namespace ddp {

struct TCPStoreOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 29500;
  bool isServer = false;
  // The job's shared secret; empty means "read DDP_STORE_TOKEN" (which may be unset = "").
  std::string token;
  bool tokenFromEnvironment = true;
  std::chrono::milliseconds connectTimeout{60000};
  std::chrono::milliseconds timeout{Store::kDefaultTimeout};
};

// The environment variable that carries the job's store token.
constexpr const char* kStoreTokenEnv = "DDP_STORE_TOKEN";

class TCPStoreServer;  // defined in tcp_store.cpp

class TCPStore : public Store {
 public:
  explicit TCPStore(TCPStoreOptions options);
  ~TCPStore() override;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) override;
  std::string describe() const override;

  // The port actually bound (useful with port 0).
  uint16_t port() const { return port_; }
  // Connections refused so far: bad token, garbage, oversized frames (server side only).
  int64_t refusedConnections() const;

 private:
  Bytes request(uint8_t command, const std::vector<std::string>& keys, const Bytes& value,
                std::chrono::milliseconds timeout);
  int borrowConnection();
  void returnConnection(int fd);
  int connect(std::chrono::milliseconds connectTimeout);
  std::string hostPort() const;

  TCPStoreOptions options_;
  std::string token_;
  uint16_t port_ = 0;
  std::unique_ptr<TCPStoreServer> server_;
  // Idle connections to the server. One request is in flight per connection;
  // a request borrows an idle one or opens another, so a get() blocked in
  // one thread never holds up a set() from another thread of this process.
  std::mutex poolMutex_;
  std::vector<int> idleSockets_;
  std::string lostReason_;  // why the server went away; "" while it is up
};

}  // namespace ddp
