// The framework's error types. Recoverable failures are exceptions of these
// types; broken invariants are asserts (DDP_CHECK), which also throw so that
// a rank never aborts without saying why.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace ddp {

// Anything a user can fix from the message: bad config, unknown name, ...
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A collective that failed, timed out, or disagreed across ranks. The
// message names rank, backend, operation, sequence number and element count.
class CollectiveError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An operation the backend does not implement.
class NotSupportedError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Throws E with a message built by fmt, so a throw site reads as one line:
//   fail<UsageError>("{}: expected a number > 0, got {}", path, value);
template <typename E, typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw E(fmt::format(format, std::forward<Args>(args)...));
}

[[noreturn]] void failInvariant(const char* condition, const char* file, int line, const std::string& what);

}  // namespace ddp

#define DDP_CHECK(cond, what)                                         \
  do {                                                                \
    if (!(cond)) ::ddp::failInvariant(#cond, __FILE__, __LINE__, what); \
  } while (0)
