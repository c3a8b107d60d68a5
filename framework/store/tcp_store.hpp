// TCPStore: a Store served over TCP by one process (rank 0) and used by all.
//
// Contract (in addition to store.hpp)
// - The server binds host:port (port 0 picks a free one; see port()). A port
//   already in use fails at once with StoreError naming the port.
// - Clients connect with retries until `connectTimeout`, then fail with
//   StoreError naming host:port and the last socket error.
// - Every connection starts with a handshake that carries the job's token.
//   The server refuses a connection whose token differs, logs the refusal
//   as a warning (stderr), and keeps serving the others. The token comes from
//   DDP_STORE_TOKEN unless given explicitly; `ddp-run` generates one for
//   the ranks it spawns.
// - A server that goes away makes pending calls fail with StoreError rather
//   than block.
// - With DDP_LOG_LEVEL=info the server logs the address it listens on, and
//   each TCPStore the address it connected to, after how long and how many
//   attempts; nothing at the default level.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
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
  // Server only: a socket already bound and listening (the launcher's, see
  // DDP_STORE_LISTEN_FD in docs/clusters.md), served instead of binding
  // host:port anew. Adopted when it listens on `port`; otherwise left alone
  // and host:port bound as usual.
  int listenFd = -1;
};

// The environment variable that carries the job's store token.
constexpr const char* kStoreTokenEnv = "DDP_STORE_TOKEN";

namespace tcpstore {
class Client;  // framework/store/tcp/client.hpp
class Server;  // framework/store/tcp/server.hpp
}  // namespace tcpstore

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
  TCPStoreOptions options_;
  uint16_t port_ = 0;
  std::unique_ptr<tcpstore::Server> server_;  // rank 0 only
  std::unique_ptr<tcpstore::Client> client_;
};

}  // namespace ddp
