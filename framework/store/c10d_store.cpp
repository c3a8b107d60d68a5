#include "ddp/config.hpp"

#if DDP_HAVE_C10D_STORE

#include "framework/store/c10d_store.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <thread>

namespace ddp {

namespace {

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
  } catch (const StoreError&) {
    throw;
  } catch (const std::exception& e) {
    const std::string reason = c10dErrorText(e);
    if (isTimeout(reason)) throw StoreTimeout(fmt::format("store {}: timed out on {}: {}", where, what, reason));
    throw StoreError(fmt::format("store {}: {} failed: {}", where, what, reason));
  }
}

}  // namespace

// c10::Error without its backtrace; c10d's TimeoutError and C10dError, and
// std::system_error when the server's connection resets, as they are.
std::string c10dErrorText(const std::exception& e) {
  const auto* c10 = dynamic_cast<const c10::Error*>(&e);
  const std::string text = c10 ? c10->what_without_backtrace() : e.what();
  return text.substr(0, text.find('\n'));
}

C10dStore::C10dStore(c10::intrusive_ptr<c10d::Store> store, std::string where, std::chrono::milliseconds timeout)
    : store_(std::move(store)), where_(std::move(where)) {
  timeout_ = timeout;
}

void C10dStore::set(const std::string& key, const Bytes& value) {
  translated(where_, "set '" + key + "'", [&] { store_->set(key, value); });
}

Bytes C10dStore::get(const std::string& key) {
  wait({key});
  return translated(where_, "get '" + key + "'", [&] { return store_->get(key); });
}

int64_t C10dStore::add(const std::string& key, int64_t delta) {
  return translated(where_, "add '" + key + "'", [&] { return store_->add(key, delta); });
}

bool C10dStore::check(const std::vector<std::string>& keys) {
  return translated(where_, "check " + keysText(keys), [&] { return store_->check(keys); });
}

void C10dStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
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

}  // namespace ddp

#endif
