// Utilities shared by the ddp-bench subcommands: statistics, byte sizes,
// table and JSON output, and launching one worker process per rank.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "framework/core/strings.hpp"

#include "framework/comm/process_group.hpp"
#include "framework/store/store.hpp"
#include "benchmarks/sim_cluster.hpp"

namespace ddp::bench {

// A failure that ends a benchmark with a message for the user (exit code 1).
class BenchError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// ---- statistics and units ---------------------------------------------------

// The median of `samples` (mean of the two middle ones for an even count).
double median(std::vector<double> samples);

// "4096", "4K", "4KiB", "64M", "1G" -> bytes (K/M/G are powers of 1024).
// Throws BenchError on anything else.
int64_t parseByteSize(const std::string& text);
// Labels and cells use formatBytes and formatFixed (framework/core/strings.hpp).

// min, min*factor, min*factor^2, ... up to and including max.
std::vector<int64_t> geometricSizes(int64_t minBytes, int64_t maxBytes, int64_t factor);

// Splits "a,b,,c" into {"a","b","c"}.
std::vector<std::string> splitList(const std::string& text, char separator = ',');

// ---- output -----------------------------------------------------------------

// A plain-text table: left-aligned first columns, right-aligned numbers.
class Table {
 public:
  explicit Table(std::vector<std::string> header, size_t leftAlignedColumns = 1);
  void addRow(std::vector<std::string> row);
  std::string render() const;

 private:
  std::vector<std::string> header_;
  size_t leftAligned_;
  std::vector<std::vector<std::string>> rows_;
};

// Writes `value` to `path` (pretty-printed), via a temporary file and a
// rename so that a reader never sees half a file.
void writeJsonFile(const std::string& path, const nlohmann::json& value);
nlohmann::json readJsonFile(const std::string& path);

// --json FILE and --plot FILE.png of a benchmark command. checkOutputPaths()
// runs before the benchmark, so that a path that cannot be written, or a
// missing ddp-plot, fails at once rather than after minutes of measuring.
// writeRecords() writes the JSON (when asked) and draws the PNG with
// `ddp-plot auto` (scripts/ddp-plot: next to this executable once
// installed, else in the source tree).
void checkOutputPaths(const std::string& jsonPath, const std::string& plotPath);
void writeRecords(const std::string& jsonPath, const std::string& plotPath, const nlohmann::json& records);

// ---- worker processes -------------------------------------------------------

// A private directory under $TMPDIR (or /tmp), removed with its files when
// this object goes away. Workers leave their results and errors there.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The file in which worker `rank` describes why it failed (see launchRanks).
std::string workerErrorPath(const std::string& dir, const std::string& tag, int rank);

// Runs `worldSize` copies of this executable (/proc/self/exe), the i-th with
// argumentsForRank(i), and waits for all of them. Returns when every one has
// exited with status 0. Otherwise (a non-zero status, a signal, or
// `timeLimit` passing) it kills the ones still running and throws
// BenchError naming each failed rank, with the text the rank left in
// workerErrorPath(errorDir, tag, rank) if any. Workers are started with
// spawnProcess (framework/launch/spawn.hpp); they inherit stdout, stderr
// and the environment, and also die if this process dies.
// With a `cluster`, rank r runs inside host layout.hostOf(r) of it, and
// finds its peers through benchMasterAddr() and benchHostAddr().
// The function a worker runs in a copy of this process instead of exec'ing
// it again (spawn.hpp's inProcessEntry: when this process is
// single-threaded, a worker skips LibTorch's 0.8 s of loading); ddp-bench's
// main sets it to itself. Unset, or on a simulated cluster (a worker runs
// behind `ip netns exec`), workers exec.
void setWorkerEntry(std::function<int(const std::vector<std::string>& argv)> entry);

void launchRanks(int worldSize, const std::function<std::vector<std::string>(int rank)>& argumentsForRank,
                 std::chrono::seconds timeLimit, const std::string& errorDir, const std::string& tag,
                 const SimCluster* cluster = nullptr, HostLayout layout = {});

// For a worker: where rank 0's store listens (DDP_BENCH_MASTER_ADDR, set by
// launchRanks on a simulated cluster; else 127.0.0.1), and this rank's own
// address (DDP_BENCH_HOST_ADDR; else 127.0.0.1).
std::string benchMasterAddr();
std::string benchHostAddr();

// From the first call on, SIGINT, SIGTERM and SIGHUP no longer kill this
// process at once: they are recorded, and launchRanks then stops its
// workers and throws BenchError naming the signal, so that destructors
// (a SimCluster's teardown) run. stopSignal(): the signal, or 0.
void catchStopSignals();
int stopSignal();

// For a worker: records `message` where launchRanks looks for it.
void reportWorkerError(const std::string& dir, const std::string& tag, int rank, const std::string& message);

// The body of a subcommand that runs itself as workers (see launchRanks):
// a worker (rank >= 0) runs `worker`; if that throws, it prints and reports
// the error (reportWorkerError) and exits with 1 without destructors (a
// group whose peer has gone could block in its teardown). Otherwise
// `launcher` runs; if it throws, "ddp-bench COMMAND: error: ..." goes to
// stderr and CLI::RuntimeError(1) sets the exit code.
void runWorkerOrLauncher(const std::string& command, int rank, const std::string& dir, const std::string& tag,
                         const std::function<void()>& worker, const std::function<void()>& launcher);

// Store rendezvous between worker processes: rank 0's store listens on a
// free port and publishes it in `portFile`; the others wait for it (no race
// over picking a free port in the launcher).
void publishPort(const std::string& portFile, uint16_t port);

// A worker's process group over loopback: rank 0 serves a TCP store whose
// port it publishes in DIR/port.TAG, the others wait for it; then the
// backend's group (deviceIndex: GPU backends' device, -1 for none).
// `storeOut`, when given, receives the store (for sub-groups).
std::shared_ptr<ProcessGroup> workerGroup(const std::string& dir, const std::string& tag, int rank, int world,
                                          const std::string& backend, std::chrono::milliseconds timeout,
                                          int deviceIndex = -1, std::shared_ptr<Store>* storeOut = nullptr);
// Bytes this network namespace has sent on its interfaces other than lo
// (/sys/class/net/*/statistics/tx_bytes): a simulated host's traffic on its link.
int64_t linkSentBytes();
uint16_t awaitPort(const std::string& portFile, std::chrono::milliseconds timeout, int rank);

}  // namespace ddp::bench
