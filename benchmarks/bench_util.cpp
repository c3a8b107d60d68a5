#include "benchmarks/bench_util.hpp"

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <optional>
#include <fstream>
#include <sstream>
#include <thread>

#include "framework/core/errors.hpp"
#include "framework/core/strings.hpp"
#include "framework/core/system.hpp"
#include "backends/builtin.hpp"
#include "framework/comm/backend_registry.hpp"
#include "framework/launch/rank_env.hpp"
#include "framework/launch/spawn.hpp"
#include "framework/store/tcp_store.hpp"
#include "benchmarks/bench_python.hpp"
#include "ddp/config.hpp"

namespace ddp::bench {

namespace fs = std::filesystem;

double median(std::vector<double> samples) {
  if (samples.empty()) throw BenchError("median of no samples");
  const size_t mid = samples.size() / 2;
  std::nth_element(samples.begin(), samples.begin() + mid, samples.end());
  const double upper = samples[mid];
  if (samples.size() % 2 == 1) return upper;
  // The lower middle is the largest element of the left part.
  const double lower = *std::max_element(samples.begin(), samples.begin() + mid);
  return (lower + upper) / 2;
}

int64_t parseByteSize(const std::string& text) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  std::string suffix = text.substr(digits);
  std::transform(suffix.begin(), suffix.end(), suffix.begin(), [](unsigned char c) { return std::toupper(c); });
  if (digits == 0 || digits > 15) fail<BenchError>("bad byte size '{}' (expected e.g. 4096, 4K, 64M)", text);
  int64_t multiplier = 0;
  if (suffix.empty() || suffix == "B") multiplier = 1;
  else if (suffix == "K" || suffix == "KB" || suffix == "KIB") multiplier = int64_t{1} << 10;
  else if (suffix == "M" || suffix == "MB" || suffix == "MIB") multiplier = int64_t{1} << 20;
  else if (suffix == "G" || suffix == "GB" || suffix == "GIB") multiplier = int64_t{1} << 30;
  else fail<BenchError>("bad byte size '{}': unknown suffix '{}' (use K, M or G)", text, suffix);
  return std::stoll(text.substr(0, digits)) * multiplier;
}

std::vector<int64_t> geometricSizes(int64_t minBytes, int64_t maxBytes, int64_t factor) {
  if (minBytes <= 0 || maxBytes < minBytes) {
    fail<BenchError>("bad size range: min {} B, max {} B", minBytes, maxBytes);
  }
  if (factor < 2) throw BenchError("size factor must be at least 2");
  std::vector<int64_t> sizes;
  for (int64_t s = minBytes; s <= maxBytes; s *= factor) {
    sizes.push_back(s);
    if (s > maxBytes / factor) break;  // the next step would overflow or pass max
  }
  return sizes;
}

std::vector<std::string> splitList(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, separator)) {
    if (!part.empty()) parts.push_back(part);
  }
  return parts;
}

// ---- output -----------------------------------------------------------------

Table::Table(std::vector<std::string> header, size_t leftAlignedColumns)
    : header_(std::move(header)), leftAligned_(leftAlignedColumns) {}

void Table::addRow(std::vector<std::string> row) {
  row.resize(header_.size());
  rows_.push_back(std::move(row));
}

std::string Table::render() const {
  std::vector<size_t> width(header_.size());
  for (size_t c = 0; c < header_.size(); ++c) {
    width[c] = header_[c].size();
    for (const auto& row : rows_) width[c] = std::max(width[c], row[c].size());
  }
  auto line = [&](const std::vector<std::string>& cells) {
    std::string out;
    for (size_t c = 0; c < cells.size(); ++c) {
      if (c > 0) out += "  ";
      const std::string pad(width[c] - cells[c].size(), ' ');
      out += c < leftAligned_ ? cells[c] + pad : pad + cells[c];
    }
    // No trailing blanks from a padded last column.
    out.erase(out.find_last_not_of(' ') + 1);
    return out + "\n";
  };
  std::string out = line(header_);
  for (const auto& row : rows_) out += line(row);
  return out;
}

void writeJsonFile(const std::string& path, const nlohmann::json& value) {
  const std::string temporary = fmt::format("{}.tmp.{}", path, ::getpid());
  {
    std::ofstream out(temporary);
    if (!out) fail<BenchError>("cannot write {}: {}", temporary, errnoText(errno));
    out << value.dump(2) << "\n";
    if (!out.flush()) fail<BenchError>("cannot write {}: {}", temporary, errnoText(errno));
  }
  std::error_code error;
  fs::rename(temporary, path, error);
  if (error) fail<BenchError>("cannot rename {} to {}: {}", temporary, path, error.message());
}

namespace {

std::string ddpPlotProgram() {
  std::error_code error;
  const fs::path self = fs::read_symlink("/proc/self/exe", error);
  if (!error) {
    const fs::path installed = self.parent_path() / "ddp-plot";
    if (fs::exists(installed)) return installed.string();
  }
  return std::string(DDP_SOURCE_DIR) + "/scripts/ddp-plot";
}

}  // namespace

namespace {

// `option PATH` names a file this run will write: its folder must exist
// and be writable.
void checkWritableFile(const char* option, const std::string& path) {
  const fs::path parent = fs::absolute(path).parent_path();
  if (!fs::is_directory(parent)) {
    fail<BenchError>("{} {}: the folder {} does not exist. HINT: create it first", option, path, parent.string());
  }
  if (::access(parent.c_str(), W_OK) != 0) {
    fail<BenchError>("{} {}: cannot write into {}: {}", option, path, parent.string(), errnoText(errno));
  }
}

}  // namespace

void checkOutputPaths(const std::string& jsonPath, const std::string& plotPath) {
  if (!jsonPath.empty()) checkWritableFile("--json", jsonPath);
  if (plotPath.empty()) return;
  checkWritableFile("--plot", plotPath);
  const std::string program = ddpPlotProgram();
  if (::access(program.c_str(), X_OK) != 0) {
    fail<BenchError>("--plot: {} is missing or not executable; it draws the pictures", program);
  }
}

void writeRecords(const std::string& jsonPath, const std::string& plotPath, const nlohmann::json& records) {
  if (!jsonPath.empty()) {
    writeJsonFile(jsonPath, records);
    std::cerr << "wrote " << jsonPath << "\n";
  }
  if (plotPath.empty()) return;
  std::optional<TempDir> scratch;
  std::string input = jsonPath;
  if (input.empty()) {
    scratch.emplace("ddp-bench-plot");
    input = scratch->path() + "/records.json";
    writeJsonFile(input, records);
  }
  const std::string command =
      fmt::format("{} auto {} -o {} 2>&1", shellQuote(ddpPlotProgram()), shellQuote(input), shellQuote(plotPath));
  std::string output;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) fail<BenchError>("--plot: cannot start ddp-plot: {}", errnoText(errno));
  char buffer[512];
  while (std::fgets(buffer, sizeof(buffer), pipe) != nullptr) output += buffer;
  const int status = ::pclose(pipe);
  while (!output.empty() && output.back() == '\n') output.pop_back();
  if (status != 0) {
    fail<BenchError>("--plot {}: {}", plotPath, output.empty() ? fmt::format("ddp-plot failed (status {})", status)
                                                               : output);
  }
  std::cerr << "wrote " << plotPath << "\n";
}

nlohmann::json readJsonFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail<BenchError>("cannot read {}: {}", path, errnoText(errno));
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    fail<BenchError>("cannot parse {}: {}", path, e.what());
  }
}

// ---- worker processes -------------------------------------------------------

TempDir::TempDir(const std::string& prefix) {
  const char* base = std::getenv("TMPDIR");
  std::string pattern = std::string(base && *base ? base : "/tmp") + "/" + prefix + "XXXXXX";
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  if (!::mkdtemp(buffer.data())) {
    fail<BenchError>("cannot create a temporary directory {}: {}", pattern, errnoText(errno));
  }
  path_ = buffer.data();
}

TempDir::~TempDir() {
  std::error_code ignored;
  fs::remove_all(path_, ignored);
}

std::string workerErrorPath(const std::string& dir, const std::string& tag, int rank) {
  return fmt::format("{}/error.{}.rank{}", dir, tag, rank);
}

void reportWorkerError(const std::string& dir, const std::string& tag, int rank, const std::string& message) {
  std::ofstream out(workerErrorPath(dir, tag, rank));
  out << message;
}

namespace {

bool succeeded(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }

}  // namespace

namespace {
std::atomic<int> gStopSignal{0};
extern "C" void recordStopSignal(int sig) { gStopSignal.store(sig); }
}  // namespace

void catchStopSignals() {
  struct sigaction action {};
  action.sa_handler = recordStopSignal;
  action.sa_flags = SA_RESETHAND;  // a second signal acts as if none were caught
  sigemptyset(&action.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &action, nullptr);
}

int stopSignal() { return gStopSignal.load(); }

std::string benchMasterAddr() {
  const char* v = std::getenv("DDP_BENCH_MASTER_ADDR");
  return v && *v ? v : "127.0.0.1";
}

std::string benchHostAddr() {
  const char* v = std::getenv("DDP_BENCH_HOST_ADDR");
  return v && *v ? v : "127.0.0.1";
}

namespace {
std::function<int(const std::vector<std::string>&)> gWorkerEntry;
}  // namespace

void setWorkerEntry(std::function<int(const std::vector<std::string>& argv)> entry) { gWorkerEntry = std::move(entry); }

void launchRanks(int worldSize, const std::function<std::vector<std::string>(int rank)>& argumentsForRank,
                 std::chrono::seconds timeLimit, const std::string& errorDir, const std::string& tag,
                 const SimCluster* cluster, HostLayout layout) {
  std::vector<pid_t> pids(worldSize, -1);
  std::vector<bool> running(worldSize, false);
  auto killRunning = [&] {
    for (int r = 0; r < worldSize; ++r) {
      if (running[r]) ::kill(pids[r], SIGKILL);
    }
    for (int r = 0; r < worldSize; ++r) {
      if (running[r]) ::waitpid(pids[r], nullptr, 0);
      running[r] = false;
    }
  };

  try {
    for (int r = 0; r < worldSize; ++r) {
      SpawnOptions options;
      options.program = "/proc/self/exe";
      options.argv = argumentsForRank(r);
      options.argv.insert(options.argv.begin(), "ddp-bench");
      if (cluster) {
        const int host = layout.hostOf(r);
        options.argv[0] = std::filesystem::read_symlink("/proc/self/exe").string();
        options.argv = cluster->wrap(host, options.argv);
        options.program = options.argv[0];
        EnvMap env = currentEnvironment();
        env["DDP_BENCH_MASTER_ADDR"] = cluster->address(0);
        env["DDP_BENCH_HOST_ADDR"] = cluster->address(host);
        options.environment = std::move(env);
      } else {
        options.inProcessEntry = gWorkerEntry;
      }
      // A worker must not outlive the launcher (e.g. when it is killed), or
      // it would hold the cores and ports of the next run.
      options.dieWithParent = true;
      pids[r] = spawnProcess(options).pid;
      running[r] = true;
    }
  } catch (...) {
    killRunning();
    throw;
  }

  // Poll rather than block in waitpid, so that the first failure or the
  // time limit is noticed whichever rank it concerns.
  const auto deadline = std::chrono::steady_clock::now() + timeLimit;
  std::vector<std::string> failures;
  int remaining = worldSize;
  while (remaining > 0 && failures.empty()) {
    for (int r = 0; r < worldSize; ++r) {
      if (!running[r]) continue;
      int status = 0;
      const pid_t done = ::waitpid(pids[r], &status, WNOHANG);
      if (done == 0) continue;
      running[r] = false;
      --remaining;
      if (done < 0) {
        failures.push_back(fmt::format("rank {}: waitpid failed: {}", r, errnoText(errno)));
      } else if (!succeeded(status)) {
        failures.push_back(fmt::format("rank {} {}", r, describeExitStatus(status)));
      }
    }
    if (remaining > 0 && failures.empty()) {
      if (const int sig = stopSignal()) {
        failures.push_back(fmt::format("stopped by signal {} ({})", sig, ::strsignal(sig)));
        break;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        std::vector<int> stillRunning;
        for (int r = 0; r < worldSize; ++r) {
          if (running[r]) stillRunning.push_back(r);
        }
        failures.push_back(fmt::format("rank(s) {} still running after the time limit of {} s (--timeout)",
                                       joinNames(stillRunning), timeLimit.count()));
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  if (failures.empty()) return;

  // Once one rank has failed, the others would only wait for it until
  // their collective timeout: stop them now.
  killRunning();
  std::string message = fmt::format("{} workers failed:", tag);
  for (const auto& f : failures) message += fmt::format("\n  {}", f);
  for (int r = 0; r < worldSize; ++r) {
    std::ifstream in(workerErrorPath(errorDir, tag, r));
    if (!in) continue;
    std::stringstream text;
    text << in.rdbuf();
    message += fmt::format("\n  rank {} reported: {}", r, text.str());
  }
  throw BenchError(message);
}

// Rank 0 makes its store's port known to the other ranks; the rename makes
// the file appear complete or not at all.
void publishPort(const std::string& portFile, uint16_t port) {
  const std::string temporary = portFile + ".tmp";
  {
    std::ofstream out(temporary);
    out << port << "\n";
    if (!out.flush()) fail<BenchError>("cannot write {}", temporary);
  }
  fs::rename(temporary, portFile);
}

uint16_t awaitPort(const std::string& portFile, std::chrono::milliseconds timeout, int rank) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    std::ifstream in(portFile);
    int port = 0;
    if (in >> port && port > 0 && port < 65536) return static_cast<uint16_t>(port);
    if (std::chrono::steady_clock::now() > deadline) {
      fail<BenchError>("rank {}: rank 0 did not publish its store port in {} within {} ms", rank, portFile,
                       timeout.count());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void runWorkerOrLauncher(const std::string& command, int rank, const std::string& dir, const std::string& tag,
                         const std::function<void()>& worker, const std::function<void()>& launcher) {
  if (rank >= 0) {
    try {
      worker();
    } catch (const std::exception& e) {
      std::cerr << fmt::format("ddp-bench worker ({} rank {}): {}\n", tag, rank, e.what());
      reportWorkerError(dir, tag, rank, e.what());
      std::fflush(stderr);
      std::_Exit(1);
    }
    return;
  }
  try {
    launcher();
  } catch (const std::exception& e) {
    std::cerr << "ddp-bench " << command << ": error: " << e.what() << "\n";
    throw CLI::RuntimeError(1);
  }
}

int64_t linkSentBytes() {
  int64_t total = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/sys/class/net", ec)) {
    if (entry.path().filename() == "lo") continue;
    std::ifstream in(entry.path() / "statistics" / "tx_bytes");
    int64_t bytes = 0;
    if (in >> bytes) total += bytes;
  }
  return total;
}

std::shared_ptr<ProcessGroup> workerGroup(const std::string& dir, const std::string& tag, int rank, int world,
                                          const std::string& backend, std::chrono::milliseconds timeout,
                                          int deviceIndex, std::shared_ptr<Store>* storeOut) {
  TCPStoreOptions storeOptions;
  storeOptions.host = benchMasterAddr();
  storeOptions.isServer = rank == 0;
  const std::string portFile = dir + "/port." + tag;
  storeOptions.port = storeOptions.isServer ? 0 : awaitPort(portFile, timeout, rank);
  storeOptions.connectTimeout = timeout;
  storeOptions.timeout = timeout;
  auto store = std::make_shared<TCPStore>(storeOptions);
  if (storeOptions.isServer) publishPort(portFile, store->port());
  ProcessGroupOptions groupOptions;
  groupOptions.timeout = timeout;
  groupOptions.masterAddr = benchMasterAddr();
  groupOptions.deviceIndex = deviceIndex;
  if (storeOut) *storeOut = store;
  return builtinBackends().create(backend, store, rank, world, groupOptions);
}

}  // namespace ddp::bench
