// Text for messages and tables: lists of names, numbers and durations the
// way the framework shows them everywhere, so that one wording is kept.
//
// Contract
// - joinNames({"a", "b", "c"}) is "a, b, c"; anything fmt can format joins
//   (strings, numbers); an empty list gives "".
// - showNumber: a number as a user would write it in JSON, up to 10
//   significant digits: 0.001, 30, 1e-08, 0.9.
// - formatFixed: printf's "%.*f"; "n/a" for NaN, so that a table cell that
//   was not measured reads clearly.
// - formatBytes: exact binary units for labels: 4096 -> "4 KiB",
//   1536 -> "1536 B" (a unit is used only where it divides exactly).
// - formatSeconds: a duration for progress lines: "4.2s", "3m05s", "1h02m".
// - printable: text read from a file, fit for a one-line message: control
//   characters as \xNN, cut at `limit` characters with "...".
#pragma once

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <iterator>
#include <string>

namespace ddp {

template <typename Names>
std::string joinNames(const Names& names, const char* separator = ", ") {
  std::string out;
  bool first = true;
  for (const auto& name : names) {
    if (!first) out += separator;
    fmt::format_to(std::back_inserter(out), "{}", name);
    first = false;
  }
  return out;
}

inline std::string showNumber(double value) { return fmt::format("{:.10g}", value); }

// Text from a file (a tensor's name, a key) as one line of a message shows
// it: control characters as \xNN, at most `limit` characters, then "...".
inline std::string printable(const std::string& text, size_t limit = 120) {
  std::string out;
  for (unsigned char c : text) {
    if (out.size() >= limit) return out + "...";
    if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

inline std::string formatFixed(double value, int decimals) {
  if (std::isnan(value)) return "n/a";
  return fmt::format("{:.{}f}", value, decimals);
}

inline std::string formatBytes(int64_t bytes) {
  static const char* const units[] = {"B", "KiB", "MiB", "GiB"};
  int unit = 0;
  while (unit < 3 && bytes >= 1024 && bytes % 1024 == 0) {
    bytes /= 1024;
    ++unit;
  }
  return fmt::format("{} {}", bytes, units[unit]);
}

inline std::string formatSeconds(double seconds) {
  if (seconds >= 3600) {
    return fmt::format("{}h{:02}m", static_cast<int>(seconds / 3600), static_cast<int>(std::fmod(seconds, 3600) / 60));
  }
  if (seconds >= 60) {
    return fmt::format("{}m{:02}s", static_cast<int>(seconds / 60), static_cast<int>(std::fmod(seconds, 60)));
  }
  return fmt::format("{:.1f}s", seconds);
}

}  // namespace ddp
