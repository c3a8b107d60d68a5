// The framework's error types. Recoverable failures are exceptions of these
// types; broken invariants are asserts (DDP_CHECK), which also throw so that
// a rank never aborts without saying why.
#pragma once

#include <stdexcept>
#include <string>

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

[[noreturn]] void failInvariant(const char* condition, const char* file, int line, const std::string& what);

}  // namespace ddp

#define DDP_CHECK(cond, what)                                         \
  do {                                                                \
    if (!(cond)) ::ddp::failInvariant(#cond, __FILE__, __LINE__, what); \
  } while (0)
