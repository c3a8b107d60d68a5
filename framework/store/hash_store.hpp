// HashStore: an in-memory Store shared by ranks that run as threads of one
// process (tests, single-process runs). See store.hpp for the contract.
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>

#include "framework/store/store.hpp"

namespace ddp {

class HashStore : public Store {
 public:
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) override;
  std::string describe() const override { return "memory"; }

 private:
  bool hasAll(const std::vector<std::string>& keys) const;

  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, Bytes> data_;
};

}  // namespace ddp
