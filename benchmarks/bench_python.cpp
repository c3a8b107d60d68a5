#include "benchmarks/bench_python.hpp"

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <sstream>

#include "benchmarks/bench_util.hpp"

namespace ddp::bench {

namespace {

struct CommandResult {
  int status = -1;
  std::string output;
};

// popen() rather than launchRanks: the references are not ddp-bench workers,
// and we need their stdout.
CommandResult capture(const std::string& command) {
  CommandResult result;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) return result;
  std::array<char, 4096> chunk{};
  size_t n = 0;
  while ((n = std::fread(chunk.data(), 1, chunk.size(), pipe)) > 0) result.output.append(chunk.data(), n);
  const int raw = ::pclose(pipe);
  result.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  return result;
}

std::string lastLine(const std::string& text) {
  std::string line, last;
  std::istringstream in(text);
  while (std::getline(in, line)) {
    if (!line.empty()) last = line;
  }
  return last;
}

}  // namespace

std::string shellQuote(const std::string& text) {
  std::string quoted = "'";
  for (char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

std::optional<std::string> pythonTorchUnavailable() {
  const CommandResult r = capture("python3 -c 'import torch' 2>&1");
  if (r.status == 0) return std::nullopt;
  const std::string why = lastLine(r.output);
  if (r.status == 127) return std::string("python3 not found");
  return why.empty() ? "python3 -c 'import torch' exited with " + std::to_string(r.status) : why;
}

std::vector<nlohmann::json> runJsonLines(const std::string& command) {
  const CommandResult r = capture(command);
  if (r.status != 0) {
    throw BenchError("'" + command + "' failed (exit " + std::to_string(r.status) + "): " + lastLine(r.output));
  }
  std::vector<nlohmann::json> lines;
  std::istringstream in(r.output);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line.front() != '{') continue;
    auto parsed = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (parsed.is_object()) lines.push_back(std::move(parsed));
  }
  return lines;
}

}  // namespace ddp::bench
