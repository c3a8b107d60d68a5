// C10dClientStore: a client of a store that LibTorch's c10d::TCPStore
// serves, such as torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE=True:
// the agent on the first node hosts it at MASTER_ADDR:MASTER_PORT, and
// every rank, rank 0 included, joins it as a client).
//
// Contract (in addition to store.hpp)
// - It speaks c10d's protocol through LibTorch's own client, so it works
//   with whatever LibTorch this build links. No job token: the agent's
//   store has none.
// - Connecting retries until `connectTimeout`, then fails with StoreError
//   naming host:port. c10d's failures become StoreError, its timeouts
//   StoreTimeout naming the keys. wait() polls check() (backing off to
//   50 ms) rather than using c10d's wait, whose client misbehaves after
//   short or timed-out waits in LibTorch 1.13.
// - available() is false where the build has no c10d client
//   (DDP_HAVE_C10D_STORE); constructing one then throws StoreError.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "framework/store/store.hpp"

namespace ddp {

class C10dClientStore : public Store {
 public:
  static bool available();

  C10dClientStore(const std::string& host, uint16_t port, std::chrono::milliseconds connectTimeout,
                  std::chrono::milliseconds timeout);
  ~C10dClientStore() override;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) override;
  std::string describe() const override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string where_;
};

}  // namespace ddp
