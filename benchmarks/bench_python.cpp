#include "benchmarks/bench_python.hpp"

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>

#include "benchmarks/bench_util.hpp"
#include "framework/core/errors.hpp"

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

namespace {
// The first interpreter that imports torch: $DDP_PYTHON, then python3 on the
// PATH, then Debian's own (a pyenv python3 on the PATH lacks python3-torch).
std::string& chosenPython() {
  static std::string chosen;
  return chosen;
}
}  // namespace

std::string pythonCommand() { return chosenPython().empty() ? "python3" : chosenPython(); }

std::string pythonCommandForThreads(int threads) {
  if (std::getenv("OPENBLAS_NUM_THREADS") != nullptr) return pythonCommand();
  return "OPENBLAS_NUM_THREADS=" + std::to_string(threads) + " " + pythonCommand();
}

std::optional<std::string> pythonTorchUnavailable() {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("DDP_PYTHON")) candidates.push_back(env);
  candidates.push_back("python3");
  candidates.push_back("/usr/bin/python3");
  std::string why;
  for (const auto& python : candidates) {
    const CommandResult r = capture(shellQuote(python) + " -c 'import torch' 2>&1");
    if (r.status == 0) {
      chosenPython() = shellQuote(python);
      return std::nullopt;
    }
    why += (why.empty() ? "" : "; ") + python + ": " +
           (r.status == 127 ? std::string("not found") : lastLine(r.output));
  }
  return why;
}

std::vector<nlohmann::json> runJsonLines(const std::string& command) {
  const CommandResult r = capture(command);
  if (r.status != 0) {
    // What it printed last (a traceback, or the stacks of a watchdog), then one line.
    const size_t keep = 6000;
    std::cerr << (r.output.size() > keep ? "...\n" + r.output.substr(r.output.size() - keep) : r.output) << "\n";
    fail<BenchError>("'{}' failed (exit {}): {}", command, r.status, lastLine(r.output));
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
