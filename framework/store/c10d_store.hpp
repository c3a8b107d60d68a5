// C10dStore: our Store over any LibTorch c10d::Store: the TCPStore client
// that joins torchrun's agent store (c10d_client_store.hpp), or the store
// Python's torch.distributed hands a backend it creates (python/ddp_torch).
//
// Contract (in addition to store.hpp)
// - Only where LibTorch's c10d headers exist (DDP_HAVE_C10D_STORE); this
//   header includes them.
// - c10d's failures become StoreError, its timeouts StoreTimeout, naming
//   `where` and the keys.
// - wait() polls check() (backing off to 50 ms) rather than calling c10d's
//   wait: LibTorch 1.13's TCPStore client keeps a short wait's timeout on
//   its socket, and after a wait that timed out it takes the stale reply
//   for the next request. get() waits that way first.
// - Safe from several threads as far as the c10d store is (TCPStore,
//   PrefixStore, HashStore and FileStore lock each operation).
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <string>
#include <vector>

#include "framework/store/store.hpp"

namespace ddp {

class C10dStore : public Store {
 public:
  C10dStore(c10::intrusive_ptr<c10d::Store> store, std::string where, std::chrono::milliseconds timeout);

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) override;
  std::string describe() const override { return where_; }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
  const std::string where_;
};

// The first line of what LibTorch's c10d threw (c10::Error without its
// backtrace), for errors of our own.
std::string c10dErrorText(const std::exception& e);

}  // namespace ddp
