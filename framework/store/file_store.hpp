// FileStore: a Store kept in one file, for ranks that share a file system
// but no network port. Every operation takes an exclusive flock(2) on the
// file, so separate processes (and threads) see a consistent map. Waiting
// polls the file. See store.hpp for the contract.
#pragma once

#include <mutex>
#include <string>

#include "framework/store/store.hpp"

namespace ddp {

class FileStore : public Store {
 public:
  // The file is created if absent. Its directory must exist.
  explicit FileStore(std::string path);

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) override;
  std::string describe() const override { return "file:" + path_; }

 private:
  std::string path_;
  std::mutex mutex_;  // flock is per open file description; also serialize threads
};

}  // namespace ddp
