#include "framework/store/c10d_client_store.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <thread>

#include "ddp/config.hpp"

#if DDP_HAVE_C10D_STORE
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#endif

namespace ddp {

#if DDP_HAVE_C10D_STORE

struct C10dClientStore::Impl {
  std::unique_ptr<c10d::TCPStore> store;
};

namespace {

std::string firstLine(const std::string& text) { return text.substr(0, text.find('\n')); }

std::string keysText(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& k : keys) out += (out.empty() ? "'" : ", '") + k + "'";
  return out;
}

// c10d reports a timeout in its message ("Socket Timeout", "Wait timeout").
bool isTimeout(const std::string& what) {
  return what.find("imeout") != std::string::npos || what.find("timed out") != std::string::npos;
}

template <typename Fn>
auto translated(const std::string& where, const std::string& what, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const c10::Error& e) {
    const std::string reason = firstLine(e.what_without_backtrace());
    if (isTimeout(reason)) throw StoreTimeout(fmt::format("store {}: timed out on {}: {}", where, what, reason));
    throw StoreError(fmt::format("store {}: {} failed: {}", where, what, reason));
  }
}

}  // namespace

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
  try {
    impl_->store = std::make_unique<c10d::TCPStore>(host, options);
  } catch (const c10::Error& e) {
    throw StoreError(fmt::format("cannot reach the c10d store at {}:{} within {} s: {}", host, port,
                                 connectTimeout.count() / 1000.0, firstLine(e.what_without_backtrace())));
  }
  impl_->store->setTimeout(timeout);
}

C10dClientStore::~C10dClientStore() = default;

void C10dClientStore::set(const std::string& key, const Bytes& value) {
  translated(where_, "set '" + key + "'", [&] { impl_->store->set(key, value); });
}

Bytes C10dClientStore::get(const std::string& key) {
  wait({key});
  return translated(where_, "get '" + key + "'", [&] { return impl_->store->get(key); });
}

int64_t C10dClientStore::add(const std::string& key, int64_t delta) {
  return translated(where_, "add '" + key + "'", [&] { return impl_->store->add(key, delta); });
}

bool C10dClientStore::check(const std::vector<std::string>& keys) {
  return translated(where_, "check " + keysText(keys), [&] { return impl_->store->check(keys); });
}

// By polling check(), not with c10d's wait: LibTorch 1.13's client keeps a
// short wait's timeout on its socket, and after a wait that timed out it
// takes the stale reply for the next request.
void C10dClientStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  const auto limit = effectiveTimeout(timeout);
  const auto deadline = std::chrono::steady_clock::now() + limit;
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    if (check(keys)) return;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      throw StoreTimeout(fmt::format("store {}: timed out after {} s waiting for {}", where_, limit.count() / 1000.0,
                                     keysText(keys)));
    }
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
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
