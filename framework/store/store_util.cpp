#include "framework/store/store_util.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cerrno>
#include <cstdlib>

#include "framework/core/errors.hpp"
#include "framework/core/help_links.hpp"

namespace ddp {

int64_t parseCounter(const std::string& key, const Bytes& value) {
  std::string text(value.begin(), value.end());
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || errno != 0 || end != text.c_str() + text.size()) {
    fail<StoreError>("store: key '{}' holds '{}', not a counter; add() needs a decimal integer", key, text);
  }
  return static_cast<int64_t>(v);
}

Bytes formatCounter(int64_t value) {
  const std::string text = std::to_string(value);
  return Bytes(text.begin(), text.end());
}

std::string waitTimeoutMessage(const std::string& where, const std::vector<std::string>& keys,
                               std::chrono::milliseconds timeout) {
  return fmt::format(
      "store {}: timed out after {} ms waiting for keys [{}]. HINT: the rank that sets them has not started or has "
      "failed; {}",
      where, timeout.count(), fmt::join(keys, ", "), kRendezvousHelp);
}

}  // namespace ddp
