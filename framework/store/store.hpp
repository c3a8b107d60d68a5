// Store: the key-value rendezvous that ranks use to find each other.
//
// Contract
// - Keys are strings, values are byte strings. A key, once set, may be
//   overwritten by a later `set`; readers see some complete value, never a
//   torn one.
// - `get` blocks until the key exists or the store's timeout passes, then
//   throws StoreTimeout naming the key.
// - `add` treats the value as a decimal int64 (absent = 0), adds `delta`
//   atomically across all clients and returns the new value.
// - `check` never blocks: true when every key exists.
// - `wait` blocks until every key exists, or throws StoreTimeout after
//   `timeout` (the store's default when zero).
// - Every method is safe to call from several threads at once.
// Implementations: HashStore (in memory, one process), FileStore (a file
// on a shared file system), TCPStore (rank 0 serves), PrefixStore (a
// namespace over another store).
#pragma once

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddp {

using Bytes = std::vector<uint8_t>;

class StoreError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class StoreTimeout : public StoreError {
 public:
  using StoreError::StoreError;
};

class Store {
 public:
  static constexpr std::chrono::milliseconds kDefaultTimeout{300000};

  virtual ~Store() = default;

  virtual void set(const std::string& key, const Bytes& value) = 0;
  virtual Bytes get(const std::string& key) = 0;
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  virtual bool check(const std::vector<std::string>& keys) = 0;
  virtual void wait(const std::vector<std::string>& keys,
                    std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) = 0;

  // Where this store lives, for error messages ("tcp://host:port", "file:/p").
  virtual std::string describe() const = 0;

  std::chrono::milliseconds timeout() const { return timeout_; }
  void setTimeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }

  // Conveniences over bytes.
  void setString(const std::string& key, const std::string& value) {
    set(key, Bytes(value.begin(), value.end()));
  }
  std::string getString(const std::string& key) {
    Bytes b = get(key);
    return std::string(b.begin(), b.end());
  }

 protected:
  std::chrono::milliseconds effectiveTimeout(std::chrono::milliseconds t) const {
    return t.count() > 0 ? t : timeout_;
  }

  std::chrono::milliseconds timeout_{kDefaultTimeout};
};

}  // namespace ddp
