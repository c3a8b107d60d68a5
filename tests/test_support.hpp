// Helpers for tests that run several ranks as threads of this process, and
// for those that run the ddp-run program.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <ATen/CPUGeneratorImpl.h>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <torch/nn/module.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "apps/ddp_run.hpp"
#include "backends/builtin.hpp"
#include "ddp/config.hpp"
#include "framework/comm/backend_registry.hpp"
#include "framework/data/dataset.hpp"
#include "framework/experiment/experiment_config.hpp"
#if DDP_HAVE_NCCL
#include "backends/nccl/process_group_nccl.hpp"
#endif
#include "framework/launch/distributed.hpp"
#include "framework/launch/rank_env.hpp"
#include "framework/launch/spawn.hpp"
#include "framework/store/hash_store.hpp"
#include "plugins/builtin.hpp"

namespace ddp::test {

// Runs body(rank, group) on `world` threads, each with its own group of
// `backend` over one HashStore. Returns the message of each exception that
// escaped a rank ("" where none did); Catch2 asserts only in the caller's
// thread, since its macros are not thread-safe.
// optionsOf(rank), when given, gives each rank its own options (a host id).
inline std::vector<std::string> runRanks(const std::string& backend, int world,
                                         const std::function<void(int, ProcessGroup&)>& body,
                                         ProcessGroupOptions options = {},
                                         const std::function<ProcessGroupOptions(int)>& optionsOf = nullptr) {
  auto store = std::make_shared<HashStore>();
  store->setTimeout(std::chrono::milliseconds(30000));
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto group = builtinBackends().create(backend, store, r, world, optionsOf ? optionsOf(r) : options);
        body(r, *group);
      } catch (const std::exception& e) {
        errors[r] = e.what();
        if (errors[r].empty()) errors[r] = "(empty exception message)";
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

// One rank over gloo and an in-memory store: what runTraining needs alone.
inline DistributedContext singleProcessContext() {
  DistributedContext ctx;
  ctx.store = std::make_shared<HashStore>();
  ctx.group = builtinBackends().create("gloo", ctx.store, 0, 1);
  return ctx;
}

// Deterministic and thread-safe parameters (normal, scale 0.3): ranks run
// concurrently as threads, so the global RNG that module constructors use
// gives no reproducible values.
inline void initParameters(torch::nn::Module& module, uint64_t seed) {
  at::NoGradGuard noGrad;
  auto gen = at::detail::createCPUGenerator(seed);
  for (auto& p : module.parameters()) p.copy_(at::randn(p.sizes(), gen, p.options()) * 0.3);
}

inline std::string joinErrors(const std::vector<std::string>& errors) {
  std::string all;
  for (size_t r = 0; r < errors.size(); ++r) {
    if (!errors[r].empty()) all += "rank " + std::to_string(r) + ": " + errors[r] + "\n";
  }
  return all;
}

// CUDA devices this process sees (0 when NCCL is not compiled in).
inline int cudaDevices() {
#if DDP_HAVE_NCCL
  return ddp::cudaDeviceCount();
#else
  return 0;
#endif
}

// Backends that can run here; tests of the others are skipped with a reason.
inline bool backendRunnable(const std::string& backend, std::string* whyNot) {
  if (!builtinBackends().has(backend)) {
    *whyNot = "backend '" + backend + "' is not compiled into this build";
    return false;
  }
  if (backend == "nccl" && cudaDevices() == 0) {
    *whyNot = "backend 'nccl' needs CUDA devices; found 0";
    return false;
  }
  return true;
}

namespace detail {
// The folders tempDir() made, removed when the process that made them exits
// (a forked child that exits leaves its parent's folders alone).
struct TempDirsAtExit {
  const pid_t owner = ::getpid();
  std::mutex mutex;
  std::vector<std::string> paths;
  ~TempDirsAtExit() {
    if (::getpid() != owner) return;
    for (const auto& path : paths) {
      std::error_code ignored;
      std::filesystem::remove_all(path, ignored);
    }
  }
};
inline TempDirsAtExit& tempDirsAtExit() {
  static TempDirsAtExit dirs;
  return dirs;
}
}  // namespace detail

namespace detail {
// Folders of test processes that are gone without their exit handlers (a
// ctest timeout, a signal, an interrupted sweep): /tmp/ddp-test-PID-XXXXXX
// whose PID no longer runs. Another test process's are left alone, and so
// are names without a PID.
inline void removeStaleTempDirs() {
  const std::string prefix = "ddp-test-";
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/tmp", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const char* digits = name.c_str() + prefix.size();
    char* end = nullptr;
    const long pid = std::strtol(digits, &end, 10);
    if (end == digits || *end != '-' || pid <= 0) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // still running
    std::error_code ignored;
    std::filesystem::remove_all(entry.path(), ignored);
  }
}
}  // namespace detail

// A fresh folder under /tmp, removed with what is in it when this process
// exits, so that a test run leaves nothing behind; named by the process
// whose exit removes it, so that a later test process removes it if this
// one is killed first.
inline std::string tempDir() {
  auto& dirs = detail::tempDirsAtExit();
  static std::once_flag swept;
  std::call_once(swept, detail::removeStaleTempDirs);
  std::string tmpl = "/tmp/ddp-test-" + std::to_string(dirs.owner) + "-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) {
    throw std::runtime_error("mkdtemp(" + tmpl + ") failed: " + std::strerror(errno));
  }
  std::lock_guard<std::mutex> lock(dirs.mutex);
  dirs.paths.emplace_back(tmpl);
  return tmpl;
}

// Writes `content` to the file `name` in the folder `dir`; returns its path.
inline std::string writeFileIn(const std::string& dir, const std::string& name, const std::string& content) {
  const std::string path = dir + "/" + name;
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

// A fresh folder under /tmp, removed with what is in it at scope exit.
class TempDir {
 public:
  TempDir() : path_(tempDir()) {}
  ~TempDir() {
    if (::getpid() != owner_) return;  // a forked child leaves it to its parent
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  // Writes `content` to the file `name` in the folder; returns its path.
  std::string write(const std::string& name, const std::string& content) const {
    return writeFileIn(path_, name, content);
  }

 private:
  std::string path_;
  pid_t owner_ = ::getpid();
};

// A whole file as bytes ("" when it cannot be read).
inline std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The records of a JSON-lines file (metrics.jsonl, steps.jsonl), in order.
inline std::vector<nlohmann::json> jsonLines(const std::string& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> records;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) records.push_back(nlohmann::json::parse(line));
  }
  return records;
}

// The epoch of every record in a run folder's metrics.jsonl, in file order.
inline std::vector<int64_t> metricsEpochs(const std::string& runDir) {
  std::ifstream in(runDir + "/metrics.jsonl");
  std::vector<int64_t> epochs;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) epochs.push_back(nlohmann::json::parse(line)["epoch"].get<int64_t>());
  }
  return epochs;
}

// The wine experiment (experiments/wine_baseline.json) with `overrides`.
inline ExperimentConfig wine(const std::vector<std::string>& overrides) {
  return loadExperimentConfig(std::string(DDP_SOURCE_DIR) + "/experiments/wine_baseline.json", overrides,
                              builtinPlugins());
}

// runRanks lends each rank its group by reference; DDP takes shared ownership.
inline ProcessGroupPtr borrow(ProcessGroup& group) { return ProcessGroupPtr(&group, [](ProcessGroup*) {}); }

inline double maxAbsDiff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

// The largest element-wise difference between two lists of tensors.
inline double maxDifference(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>());
  return worst;
}

// True, with a "SKIPPED: <reason>" warning, when `backend` cannot run here.
inline bool skipUnlessRunnable(const std::string& backend) {
  std::string whyNot;
  if (backendRunnable(backend, &whyNot)) return false;
  WARN("SKIPPED: " << whyNot);
  return true;
}

struct ProgramOutcome {
  int exitCode = -1;
  std::string output;  // stdout and stderr together
  double seconds = 0;
};

// Words of `text` split at blanks (the test's command lines quote nothing).
inline std::vector<std::string> splitWords(const std::string& text) {
  std::vector<std::string> words;
  std::istringstream in(text);
  for (std::string word; in >> word;) words.push_back(word);
  return words;
}

// The ddp-run program the build made: DDP_RUN_PATH, which tests/CMakeLists.txt
// defines for every test file. Tests check that it exists.
// Where /usr/bin/python3 with torch and numpy can run a reference script,
// ""; else why not (for a "SKIPPED: ..." warning).
inline std::string pythonTorchUnavailable() {
  if (!std::filesystem::exists("/usr/bin/python3")) return "/usr/bin/python3 is absent";
  SpawnOptions options;
  options.argv = {"/usr/bin/python3", "-c", "import torch, numpy"};
  const FinishedProcess done = runProcess(options);
  if (!WIFEXITED(done.status) || WEXITSTATUS(done.status) != 0) return "python3 cannot import torch and numpy";
  return "";
}

// For rank bodies run on threads, where Catch's macros may not be used:
// throws `what` unless `ok` (runRanks collects it as the rank's error).
inline void expectOnRank(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

inline std::string ddpRunPath() { return DDP_RUN_PATH; }

// Runs the ddp-run program with `args` and the `env` assignments ("A=1 B=2")
// added to this process's environment, as `env A=1 B=2 ddp-run args` would.
// Without `env`, started as a copy of this process running ddp-run's main
// (linked in: apps/ddp_run.hpp), as ddp-run starts its ranks, when this
// process runs one thread; by exec of the program otherwise, or with
// DDP_SPAWN=exec. A copy skips LibTorch's loading, 0.8 s of CPU a start
// (issue 40). Whatever it starts by exec of itself runs ddp-run's main too
// (DDP_TESTS_RUN_AS). With `env`, always by exec: what the program reads
// from its environment once and keeps (gloo's chunk size, say) may already
// be read, without it, in this process and so in a copy.
inline ProgramOutcome runDdpRun(const std::string& args, const std::string& env = "") {
  const auto start = std::chrono::steady_clock::now();
  SpawnOptions options;
  options.argv = {ddpRunPath()};
  if (splitWords(env).empty()) {
    options.inProcessEntry = [](const std::vector<std::string>& argv) { return callMain(ddpRunMain, argv); };
    options.entryRunsProgram = true;
  }
  for (auto& word : splitWords(args)) options.argv.push_back(std::move(word));
  EnvMap environment = currentEnvironment();
  // Whatever job this test runs in, its rank variables are not the program's.
  for (const char* name : {"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"}) environment.erase(name);
  for (const auto& assignment : splitWords(env)) {
    const size_t equals = assignment.find('=');
    if (equals == std::string::npos) throw std::invalid_argument("runDdpRun: expected NAME=value, got " + assignment);
    environment[assignment.substr(0, equals)] = assignment.substr(equals + 1);
  }
  environment["DDP_TESTS_RUN_AS"] = "ddp-run";
  options.environment = std::move(environment);
  const FinishedProcess finished = runProcess(std::move(options));
  ProgramOutcome o;
  o.output = finished.output;
  o.exitCode = WIFEXITED(finished.status) ? WEXITSTATUS(finished.status) : -1;
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return o;
}

// Collects what this process writes to stderr (fd 2) while it lives.
class CapturedStderr {
 public:
  CapturedStderr() {
    std::fflush(stderr);
    saved_ = ::dup(STDERR_FILENO);
    ::dup2(::fileno(file_), STDERR_FILENO);
  }
  ~CapturedStderr() {
    restore();
    if (file_ != nullptr) std::fclose(file_);
  }
  CapturedStderr(const CapturedStderr&) = delete;
  CapturedStderr& operator=(const CapturedStderr&) = delete;
  std::string restore() {
    if (saved_ >= 0) {
      std::fflush(stderr);
      ::dup2(saved_, STDERR_FILENO);
      ::close(saved_);
      saved_ = -1;
      std::rewind(file_);
      char buf[4096];
      size_t n;
      while ((n = std::fread(buf, 1, sizeof buf, file_)) > 0) text_.append(buf, n);
    }
    return text_;
  }

 private:
  std::FILE* file_ = std::tmpfile();
  int saved_ = -1;
  std::string text_;
};

// Sets (or, with nullptr, unsets) an environment variable for its lifetime,
// then restores what was there: tests that need one path (DDP_GLOO_SHM=0 or
// 1) choose it themselves, whatever the caller exported.
class ScopedEnv {
 public:
  ScopedEnv(std::string name, const char* value) : name_(std::move(name)) {
    if (const char* old = std::getenv(name_.c_str())) saved_ = old, hadValue_ = true;
    if (value != nullptr) {
      ::setenv(name_.c_str(), value, 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }
  ~ScopedEnv() {
    if (hadValue_) {
      ::setenv(name_.c_str(), saved_.c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::string saved_;
  bool hadValue_ = false;
};

// The tensors of an in-memory split (a TensorDataset, as the table datasets
// return); fails the test with a message for any other kind.
inline const TensorDataset& tensors(const DatasetPtr& split) {
  const auto* t = dynamic_cast<const TensorDataset*>(split.get());
  if (t == nullptr) throw std::runtime_error("tensors(): the split is not a TensorDataset");
  return *t;
}

}  // namespace ddp::test
