// TCPStore: rank 0 serves the key-value map (tcp/server.hpp); every rank,
// rank 0 included, talks to it through a pool of connections
// (tcp/client.hpp). tcp/wire.hpp describes the protocol; tcp/socket.hpp holds
// the socket plumbing both ends share.
#include "framework/store/tcp_store.hpp"

#include <cstdlib>

#include "framework/store/store_util.hpp"
#include "framework/store/tcp/client.hpp"
#include "framework/store/tcp/server.hpp"
#include "framework/store/tcp/wire.hpp"

namespace ddp {

using namespace tcpstore;

TCPStore::TCPStore(TCPStoreOptions options) : options_(std::move(options)) {
  timeout_ = options_.timeout;
  std::string token;
  if (!options_.token.empty()) {
    token = options_.token;
  } else if (options_.tokenFromEnvironment) {
    const char* env = std::getenv(kStoreTokenEnv);
    token = env ? env : "";
  }
  port_ = options_.port;
  if (options_.isServer) {
    server_ = std::make_unique<Server>(options_.host, options_.port, token, options_.listenFd);
    port_ = server_->port();
  }
  // Connects now, so that a wrong address or token fails at construction,
  // not at the first request deep inside rendezvous.
  client_ = std::make_unique<Client>(options_.host, port_, token, options_.connectTimeout);
}

TCPStore::~TCPStore() {
  client_.reset();
  server_.reset();  // after our own connections: the server needs no goodbye from us
}

std::string TCPStore::describe() const { return client_->describe(); }

int64_t TCPStore::refusedConnections() const { return server_ ? server_->refused() : 0; }

void TCPStore::set(const std::string& key, const Bytes& value) { client_->request(kSet, {key}, value, timeout_); }

Bytes TCPStore::get(const std::string& key) { return client_->request(kGet, {key}, {}, timeout_); }

int64_t TCPStore::add(const std::string& key, int64_t delta) {
  return parseCounter(key, client_->request(kAdd, {key}, encodeDelta(delta), timeout_));
}

bool TCPStore::check(const std::vector<std::string>& keys) {
  const Bytes reply = client_->request(kCheck, keys, {}, timeout_);
  return reply.size() == 1 && reply[0] == 1;
}

void TCPStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  client_->request(kWait, keys, {}, effectiveTimeout(timeout));
}

}  // namespace ddp
