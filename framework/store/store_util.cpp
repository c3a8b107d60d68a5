#include "framework/store/store_util.hpp"

#include <cerrno>
#include <cstdlib>

#include "framework/core/help_links.hpp"

namespace ddp {

int64_t parseCounter(const std::string& key, const Bytes& value) {
  std::string text(value.begin(), value.end());
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || errno != 0 || end != text.c_str() + text.size()) {
    throw StoreError("store: key '" + key + "' holds '" + text + "', not a counter; add() needs a decimal integer");
  }
  return static_cast<int64_t>(v);
}

Bytes formatCounter(int64_t value) {
  std::string s = std::to_string(value);
  return Bytes(s.begin(), s.end());
}

std::string waitTimeoutMessage(const std::string& where, const std::vector<std::string>& keys,
                               std::chrono::milliseconds timeout) {
  std::string list;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i) list += ", ";
    list += keys[i];
  }
  return "store " + where + ": timed out after " + std::to_string(timeout.count()) +
         " ms waiting for keys [" + list + "]. HINT: the rank that sets them has not started or has failed; " +
         kRendezvousHelp;
}

}  // namespace ddp
