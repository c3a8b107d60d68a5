#include "framework/core/log.hpp"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <optional>

#include "framework/core/errors.hpp"

namespace ddp {
namespace {

std::optional<LogLevel> parseLevel(const char* text) {
  if (!text || !*text) return LogLevel::Warn;
  const std::string value = text;
  if (value == "warn" || value == "WARN") return LogLevel::Warn;
  if (value == "info" || value == "INFO") return LogLevel::Info;
  if (value == "debug" || value == "DEBUG") return LogLevel::Debug;
  return std::nullopt;
}

std::atomic<int> gLogRank{-1};

}  // namespace

LogLevel logLevel() {
  static const LogLevel level = parseLevel(std::getenv("DDP_LOG_LEVEL")).value_or(LogLevel::Warn);
  return level;
}

void checkLogLevel() {
  const char* text = std::getenv("DDP_LOG_LEVEL");
  if (!parseLevel(text)) {
    fail<UsageError>("DDP_LOG_LEVEL: '{}' is not a log level. HINT: DDP_LOG_LEVEL=warn, info or debug", text);
  }
}

void setLogRank(int rank) { gLogRank.store(rank); }

void writeLog(LogLevel level, const std::string& message) {
  static const char* const names[] = {"warn", "info", "debug"};
  // A message that names its rank itself ("[rank 1/4] gloo allreduce #7 ...",
  // as Work descriptions do) is not prefixed with it again.
  const int rank = message.rfind("[rank ", 0) == 0 ? -1 : gLogRank.load();
  std::string line = rank >= 0 ? fmt::format("ddp[{}] rank {}: {}\n", names[static_cast<int>(level)], rank, message)
                               : fmt::format("ddp[{}] {}\n", names[static_cast<int>(level)], message);
  // One write: lines of ranks that share a terminal stay whole.
  const char* data = line.data();
  size_t left = line.size();
  while (left > 0) {
    const ssize_t n = ::write(STDERR_FILENO, data, left);
    if (n <= 0) break;
    data += n;
    left -= static_cast<size_t>(n);
  }
}

}  // namespace ddp
