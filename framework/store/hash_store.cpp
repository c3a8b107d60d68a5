#include "framework/store/hash_store.hpp"

#include "framework/store/store_util.hpp"

namespace ddp {

void HashStore::set(const std::string& key, const Bytes& value) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    data_[key] = value;
  }
  changed_.notify_all();
}

Bytes HashStore::get(const std::string& key) {
  wait({key});
  std::lock_guard<std::mutex> lock(mutex_);
  return data_.at(key);
}

int64_t HashStore::add(const std::string& key, int64_t delta) {
  int64_t value;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = data_.find(key);
    value = (it == data_.end() ? 0 : parseCounter(key, it->second)) + delta;
    data_[key] = formatCounter(value);
  }
  changed_.notify_all();
  return value;
}

bool HashStore::hasAll(const std::vector<std::string>& keys) const {
  for (const auto& k : keys) {
    if (data_.count(k) == 0) return false;
  }
  return true;
}

bool HashStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mutex_);
  return hasAll(keys);
}

void HashStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  const auto limit = effectiveTimeout(timeout);
  std::unique_lock<std::mutex> lock(mutex_);
  if (!changed_.wait_for(lock, limit, [&] { return hasAll(keys); })) {
    throw StoreTimeout(waitTimeoutMessage(describe(), keys, limit));
  }
}

}  // namespace ddp
