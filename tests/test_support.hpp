// Helpers for tests that run several ranks as threads of this process.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backends/builtin.hpp"
#include "ddp/config.hpp"
#include "framework/comm/backend_registry.hpp"
#if DDP_HAVE_NCCL
#include "backends/nccl/process_group_nccl.hpp"
#endif
#include "framework/store/hash_store.hpp"

namespace ddp::test {

// Runs body(rank, group) on `world` threads, each with its own group of
// `backend` over one HashStore. Returns the message of each exception that
// escaped a rank ("" where none did); Catch2 asserts only in the caller's
// thread, since its macros are not thread-safe.
inline std::vector<std::string> runRanks(const std::string& backend, int world,
                                         const std::function<void(int, ProcessGroup&)>& body,
                                         ProcessGroupOptions options = {}) {
  auto store = std::make_shared<HashStore>();
  store->setTimeout(std::chrono::milliseconds(30000));
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto group = builtinBackends().create(backend, store, r, world, options);
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

// A fresh folder under /tmp.
inline std::string tempDir() {
  char tmpl[] = "/tmp/ddp-test-XXXXXX";
  return ::mkdtemp(tmpl);
}

#ifdef DDP_RUN_PATH
struct ProgramOutcome {
  int exitCode = -1;
  std::string output;  // stdout and stderr together
  double seconds = 0;
};

// Runs the ddp-run program with `args` (and `env` assignments before it).
inline ProgramOutcome runDdpRun(const std::string& args, const std::string& env = "") {
  const auto start = std::chrono::steady_clock::now();
  // Whatever job this test runs in, its rank variables are not the program's.
  const std::string cmd = "env -u MASTER_ADDR -u MASTER_PORT -u RANK -u WORLD_SIZE -u LOCAL_RANK " + env + " " +
                          std::string(DDP_RUN_PATH) + " " + args + " 2>&1";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  ProgramOutcome o;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) o.output.append(buf, n);
  const int status = ::pclose(pipe);
  o.exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return o;
}
#endif

}  // namespace ddp::test
