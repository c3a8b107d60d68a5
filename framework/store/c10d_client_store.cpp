#include "framework/store/c10d_client_store.hpp"

#include <fmt/format.h>

#include "ddp/config.hpp"

#if DDP_HAVE_C10D_STORE
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "framework/store/c10d_store.hpp"
#endif

namespace ddp {

#if DDP_HAVE_C10D_STORE

struct C10dClientStore::Impl {
  std::unique_ptr<C10dStore> store;
};

bool C10dClientStore::available() { return true; }

C10dClientStore::C10dClientStore(const std::string& host, uint16_t port, std::chrono::milliseconds connectTimeout,
                                 std::chrono::milliseconds timeout)
    : impl_(std::make_unique<Impl>()), where_(fmt::format("c10d://{}:{}", host, port)) {
  timeout_ = timeout;
  c10d::TCPStoreOptions options;
  options.port = port;
  options.isServer = false;
  options.waitWorkers = false;
  options.timeout = connectTimeout;  // c10d retries connecting until its timeout
  c10::intrusive_ptr<c10d::TCPStore> client;
  try {
    client = c10::make_intrusive<c10d::TCPStore>(host, options);
  } catch (const std::exception& e) {  // c10::Error, c10d's TimeoutError, a refused connection
    throw StoreError(fmt::format("cannot reach the c10d store at {}:{} within {} s: {}", host, port,
                                 connectTimeout.count() / 1000.0, c10dErrorText(e)));
  }
  client->setTimeout(timeout);
  impl_->store = std::make_unique<C10dStore>(std::move(client), where_, timeout);
}

C10dClientStore::~C10dClientStore() = default;

void C10dClientStore::set(const std::string& key, const Bytes& value) { impl_->store->set(key, value); }
// Waits with this store's timeout (setTimeout may have changed it since).
Bytes C10dClientStore::get(const std::string& key) {
  impl_->store->wait({key}, timeout_);
  return impl_->store->get(key);
}
int64_t C10dClientStore::add(const std::string& key, int64_t delta) { return impl_->store->add(key, delta); }
bool C10dClientStore::check(const std::vector<std::string>& keys) { return impl_->store->check(keys); }
void C10dClientStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  impl_->store->wait(keys, timeout.count() > 0 ? timeout : timeout_);
}
std::string C10dClientStore::describe() const { return where_; }

#else  // no c10d client in this build

struct C10dClientStore::Impl {};

bool C10dClientStore::available() { return false; }

C10dClientStore::C10dClientStore(const std::string& host, uint16_t port, std::chrono::milliseconds,
                                 std::chrono::milliseconds)
    : where_(fmt::format("c10d://{}:{}", host, port)) {
  throw StoreError(fmt::format(
      "cannot join the c10d store at {}: this build has no c10d::TCPStore client (LibTorch's does not build here)",
      where_));
}
C10dClientStore::~C10dClientStore() = default;
void C10dClientStore::set(const std::string&, const Bytes&) {}
Bytes C10dClientStore::get(const std::string&) { return {}; }
int64_t C10dClientStore::add(const std::string&, int64_t) { return 0; }
bool C10dClientStore::check(const std::vector<std::string>&) { return false; }
void C10dClientStore::wait(const std::vector<std::string>&, std::chrono::milliseconds) {}
std::string C10dClientStore::describe() const { return where_; }

#endif

}  // namespace ddp
