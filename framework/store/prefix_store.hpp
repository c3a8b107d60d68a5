// PrefixStore: a namespace inside another Store. Every key is stored as
// "<prefix>/<key>", so that several groups or jobs share one store safely.
#pragma once

#include <memory>

#include "framework/store/store.hpp"

namespace ddp {

class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base)
      : prefix_(std::move(prefix)), base_(std::move(base)) {
    timeout_ = base_->timeout();
  }

  void set(const std::string& key, const Bytes& value) override { base_->set(scoped(key), value); }
  Bytes get(const std::string& key) override { return base_->get(scoped(key)); }
  int64_t add(const std::string& key, int64_t delta) override { return base_->add(scoped(key), delta); }
  bool check(const std::vector<std::string>& keys) override { return base_->check(scoped(keys)); }
  void wait(const std::vector<std::string>& keys,
            std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) override {
    base_->wait(scoped(keys), effectiveTimeout(timeout));
  }
  std::string describe() const override { return base_->describe() + " [" + prefix_ + "/]"; }

 private:
  std::string scoped(const std::string& key) const { return prefix_ + "/" + key; }
  std::vector<std::string> scoped(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    out.reserve(keys.size());
    for (const auto& k : keys) out.push_back(scoped(k));
    return out;
  }

  std::string prefix_;
  std::shared_ptr<Store> base_;
};

}  // namespace ddp
