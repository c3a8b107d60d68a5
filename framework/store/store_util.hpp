// Helpers shared by the Store implementations.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "framework/store/store.hpp"

namespace ddp {

// Counters written by Store::add are decimal text, so every store agrees.
int64_t parseCounter(const std::string& key, const Bytes& value);
Bytes formatCounter(int64_t value);

// "store memory: timed out after 3000 ms waiting for keys [a, b]"
std::string waitTimeoutMessage(const std::string& where, const std::vector<std::string>& keys,
                               std::chrono::milliseconds timeout);

}  // namespace ddp
