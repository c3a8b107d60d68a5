// Ranks as separate processes over a TCPStore: the parent test starts copies
// of this test binary running the hidden "[.worker]" case with RANK,
// WORLD_SIZE and MASTER_* set, as ddp-run would.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "backends/builtin.hpp"
#include "framework/launch/distributed.hpp"
#include "framework/core/errors.hpp"
#include "framework/launch/launcher.hpp"
#include "framework/launch/rank_env.hpp"

using namespace ddp;

namespace {

// Starts `world` workers; returns their exit codes (-signal when killed).
// `worker` is the hidden test case to run; `shm` sets DDP_GLOO_SHM.
std::vector<int> runWorkerProcesses(int world, int port, std::chrono::seconds limit, bool shm = true,
                                    const char* worker = "[.worker]") {
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    pid_t pid = ::fork();
    if (pid == 0) {
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      ::setenv("DDP_STORE_TOKEN", "multiprocess-test", 1);
      ::setenv("DDP_GLOO_SHM", shm ? "1" : "0", 1);
      ::execl("/proc/self/exe", "ddp_tests", worker, "--abort", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  std::vector<int> codes(world, -999);
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int left = world;
  while (left > 0) {
    for (int r = 0; r < world; ++r) {
      if (codes[r] != -999) continue;
      int status;
      if (::waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
        --left;
      }
    }
    if (std::chrono::steady_clock::now() > deadline) {
      for (int r = 0; r < world; ++r) {
        if (codes[r] == -999) ::kill(pids[r], SIGKILL);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return codes;
}

// A worker's group, from the RANK/WORLD_SIZE/MASTER_* its parent set.
DistributedContext joinFromEnvironment() {
  auto env = rankEnvFromEnvironment(currentEnvironment());
  REQUIRE(env);
  DistributedOptions options;
  options.timeout = std::chrono::milliseconds(60000);
  return initDistributed(*env, options, builtinBackends());
}

}  // namespace

TEST_CASE("worker: collectives in a separate process", "[.worker]") {
  auto ctx = joinFromEnvironment();
  ProcessGroup& pg = *ctx.group;
  const int n = pg.size(), r = pg.rank();
  for (at::ScalarType dtype : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kInt, at::kLong}) {
    for (int64_t count : {0, 1, 7, 1000, 1 << 20}) {
      at::Tensor base = at::arange(count, at::kLong).remainder(7);
      at::Tensor t = (base + r + 1).to(dtype);
      pg.allreduce(t)->wait();
      REQUIRE(at::equal(t.to(at::kLong), base * n + n * (n + 1) / 2));
      at::Tensor m = (base + r + 1).to(dtype);
      pg.allreduce(m, {ReduceOp::Max})->wait();
      REQUIRE(at::equal(m.to(at::kLong), base + n));
      at::Tensor b = (base + r).to(dtype);
      pg.broadcast(b, {n - 1})->wait();
      REQUIRE(at::equal(b.to(at::kLong), base + n - 1));
      at::Tensor g = at::empty({n, count}, dtype);
      pg.allgather((base + r).to(dtype), g)->wait();
      for (int k = 0; k < n; ++k) REQUIRE(at::equal(g[k].to(at::kLong), base + k));
      at::Tensor rsIn = (at::arange(count * n, at::kLong).remainder(7) + r + 1).to(dtype);
      at::Tensor rsOut = at::empty({count}, dtype);
      pg.reduceScatter(rsIn, rsOut)->wait();
      at::Tensor rsBase = at::arange(count * n, at::kLong).remainder(7).narrow(0, r * count, count);
      REQUIRE(at::equal(rsOut.to(at::kLong), rsBase * n + n * (n + 1) / 2));
    }
  }
  pg.barrier()->wait();
}

// Processes of one host meet through shared memory unless DDP_GLOO_SHM=0,
// which leaves them the TCP path that ranks on different hosts take.
TEST_CASE("collectives across processes over a TCPStore", "[multiprocess]") {
  const bool shm = GENERATE(true, false);
  for (int world : {2, 3}) {
    const int port = pickFreePort("127.0.0.1");
    auto codes = runWorkerProcesses(world, port, std::chrono::seconds(300), shm);
    for (int r = 0; r < world; ++r) {
      INFO("world " << world << " rank " << r << (shm ? " shared memory" : " tcp"));
      CHECK(codes[r] == 0);
    }
  }
}

// Rank 1 exits after one collective; rank 0's next collective, with a 60 s
// timeout, must fail long before it, and say which rank is gone.
TEST_CASE("worker: a peer that exits mid-job", "[.worker-dies]") {
  auto ctx = joinFromEnvironment();
  ProcessGroup& pg = *ctx.group;
  at::Tensor t = at::ones({1 << 16});
  pg.allreduce(t)->wait();
  if (pg.rank() == 1) ::_exit(0);  // no goodbye: as if killed
  const auto start = std::chrono::steady_clock::now();
  std::string message;
  try {
    pg.allreduce(t)->wait();
  } catch (const CollectiveError& e) {
    message = e.what();
  }
  const auto waited = std::chrono::steady_clock::now() - start;
  INFO(message);
  REQUIRE(!message.empty());
  CHECK(message.find("[rank 0/2] gloo allreduce #") != std::string::npos);
  if (std::getenv("DDP_GLOO_SHM") == std::string("1")) CHECK(message.find("rank 1 exited") != std::string::npos);
  CHECK(waited < std::chrono::seconds(20));
  ::_exit(0);  // skip the goodbye barrier with the dead peer
}

TEST_CASE("a peer process that exits fails the next collective quickly", "[multiprocess][errors]") {
  const bool shm = GENERATE(true, false);
  INFO((shm ? "shared memory" : "tcp"));
  const int port = pickFreePort("127.0.0.1");
  auto codes = runWorkerProcesses(2, port, std::chrono::seconds(90), shm, "[.worker-dies]");
  CHECK(codes[0] == 0);
  CHECK(codes[1] == 0);
}

TEST_CASE("an unreachable master fails with a clear error", "[multiprocess][errors]") {
  RankEnv env;
  env.rank = 1;
  env.worldSize = 2;
  env.masterAddr = "127.0.0.1";
  env.masterPort = pickFreePort("127.0.0.1");  // nobody listens there
  DistributedOptions options;
  options.connectTimeout = std::chrono::milliseconds(1000);
  const auto start = std::chrono::steady_clock::now();
  try {
    initDistributed(env, options, builtinBackends());
    FAIL("no error without a master");
  } catch (const std::exception& e) {
    std::string msg = e.what();
    INFO(msg);
    CHECK(msg.find("127.0.0.1:" + std::to_string(env.masterPort)) != std::string::npos);
  }
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
}

TEST_CASE("a wrong master address fails with a clear error", "[multiprocess][errors]") {
  RankEnv env;
  env.rank = 1;
  env.worldSize = 2;
  env.masterAddr = "no-such-host.invalid";
  env.masterPort = 29500;
  DistributedOptions options;
  options.connectTimeout = std::chrono::milliseconds(1000);
  try {
    initDistributed(env, options, builtinBackends());
    FAIL("no error for an unresolvable master");
  } catch (const std::exception& e) {
    std::string msg = e.what();
    INFO(msg);
    CHECK(msg.find("no-such-host.invalid") != std::string::npos);
  }
}
