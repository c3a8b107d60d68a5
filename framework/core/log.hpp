// Levelled logging for the framework, chosen by DDP_LOG_LEVEL (as NCCL_DEBUG
// does for NCCL):
//   warn   (default) warnings only; errors are exceptions, not log lines
//   info   also start-up: the rendezvous, the group and its backend, DDP's
//          bucket layout
//   debug  also every collective as it is queued (operation, sequence
//          number, dtype, element count)
// Each line is one write to stderr, "ddp[info] rank 1: ...", so lines of
// ranks sharing a terminal stay whole. A level that is not on costs one
// integer comparison; its message is never formatted.
#pragma once

#include <fmt/format.h>

#include <string>
#include <utility>

namespace ddp {

enum class LogLevel { Warn = 0, Info = 1, Debug = 2 };

// The level DDP_LOG_LEVEL asks for; an unknown value counts as warn (see
// checkLogLevel for the error).
LogLevel logLevel();
// Throws UsageError naming DDP_LOG_LEVEL when it is set to an unknown value;
// programs call it at start-up.
void checkLogLevel();
// Named in every later line of this process ("rank 3"), except lines that
// begin by naming their rank ("[rank 3/4] ..."); -1: none.
void setLogRank(int rank);
void writeLog(LogLevel level, const std::string& message);

template <typename... Args>
void logAt(LogLevel level, fmt::format_string<Args...> format, Args&&... args) {
  if (static_cast<int>(logLevel()) >= static_cast<int>(level)) {
    writeLog(level, fmt::format(format, std::forward<Args>(args)...));
  }
}
template <typename... Args>
void logWarn(fmt::format_string<Args...> format, Args&&... args) {
  logAt(LogLevel::Warn, format, std::forward<Args>(args)...);
}
template <typename... Args>
void logInfo(fmt::format_string<Args...> format, Args&&... args) {
  logAt(LogLevel::Info, format, std::forward<Args>(args)...);
}
template <typename... Args>
void logDebug(fmt::format_string<Args...> format, Args&&... args) {
  logAt(LogLevel::Debug, format, std::forward<Args>(args)...);
}

}  // namespace ddp
