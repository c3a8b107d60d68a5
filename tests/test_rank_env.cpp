// Rank layouts from torchrun-style variables, SLURM and OpenMPI; the message
// helpers of framework/core/strings.hpp that their errors use.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <iomanip>
#include <set>
#include <sstream>

#include "framework/core/errors.hpp"
#include "framework/core/strings.hpp"
#include "framework/launch/rank_env.hpp"

using namespace ddp;

TEST_CASE("torchrun-style variables", "[launcher][env]") {
  auto e = rankEnvFromEnvironment({{"RANK", "5"},
                                   {"WORLD_SIZE", "8"},
                                   {"LOCAL_RANK", "1"},
                                   {"LOCAL_WORLD_SIZE", "4"},
                                   {"MASTER_ADDR", "10.1.2.3"},
                                   {"MASTER_PORT", "29411"}});
  REQUIRE(e);
  CHECK(e->source == "torchrun");
  CHECK(e->rank == 5);
  CHECK(e->worldSize == 8);
  CHECK(e->localRank == 1);
  CHECK(e->localWorldSize == 4);
  CHECK(e->nodeRank == 1);
  CHECK(e->masterAddr == "10.1.2.3");
  CHECK(e->masterPort == 29411);
}

TEST_CASE("ddp-run's own variables are recognised as such", "[launcher][env]") {
  auto e = rankEnvFromEnvironment({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"DDP_RUN_LAUNCHED", "1"}});
  REQUIRE(e);
  CHECK(e->source == "ddp-run");
}

TEST_CASE("no variables means a plain single process", "[launcher][env]") {
  CHECK_FALSE(rankEnvFromEnvironment({{"HOME", "/root"}}));
}

TEST_CASE("malformed variables name the variable", "[launcher][env]") {
  CHECK_THROWS_WITH(rankEnvFromEnvironment({{"RANK", "one"}, {"WORLD_SIZE", "2"}}), Catch::Contains("RANK='one'"));
  CHECK_THROWS_WITH(rankEnvFromEnvironment({{"RANK", "2"}, {"WORLD_SIZE", "2"}}),
                    Catch::Contains("RANK=2 is not below WORLD_SIZE=2"));
  CHECK_THROWS_WITH(rankEnvFromEnvironment({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}}),
                    Catch::Contains("MASTER_PORT=70000"));
}

TEST_CASE("the launchers' restart counters: any above 0 is a restart, the nearest set one counts",
          "[launcher][env]") {
  CHECK_FALSE(restartedByAnyLauncher({}));
  CHECK(restartCount({}) == 0);
  CHECK_FALSE(restartVariable({{"DDP_RESTART", ""}}, "DDP_RESTART").has_value());
  CHECK(restartVariable({{"DDP_RESTART", "3"}}, "DDP_RESTART") == 3);
  // Malformed or negative: no restart, never an error.
  for (const char* bad : {"x", "2x", "-1", "0"}) {
    INFO(bad);
    CHECK(restartVariable({{"TORCHELASTIC_RESTART_COUNT", bad}}, "TORCHELASTIC_RESTART_COUNT") == 0);
    CHECK_FALSE(restartedByAnyLauncher({{"TORCHELASTIC_RESTART_COUNT", bad}}));
  }
  for (const char* name : kRestartVariables) {
    INFO(name);
    CHECK(restartedByAnyLauncher({{name, "1"}}));
    CHECK(restartCount({{name, "2"}}) == 2);
  }
  // ddp-run's first attempt inside a requeued SLURM job: a restart (it
  // resumes), and ddp-run's own count (0) is the one recorded.
  const EnvMap requeued{{"DDP_RESTART", "0"}, {"SLURM_RESTART_COUNT", "2"}};
  CHECK(restartedByAnyLauncher(requeued));
  CHECK(restartCount(requeued) == 0);
  CHECK(restartCount({{"TORCHELASTIC_RESTART_COUNT", "1"}, {"SLURM_RESTART_COUNT", "4"}}) == 1);
}

TEST_CASE("SLURM variables, master from the node list, port from the job id", "[launcher][env]") {
  auto e = rankEnvFromEnvironment({{"SLURM_PROCID", "3"},
                                   {"SLURM_NTASKS", "4"},
                                   {"SLURM_LOCALID", "1"},
                                   {"SLURM_NODEID", "1"},
                                   {"SLURM_NTASKS_PER_NODE", "2(x2)"},
                                   {"SLURM_JOB_NODELIST", "gpu[07-08]"},
                                   {"SLURM_JOB_ID", "123456"}});
  REQUIRE(e);
  CHECK(e->source == "slurm");
  CHECK(e->rank == 3);
  CHECK(e->worldSize == 4);
  CHECK(e->localRank == 1);
  CHECK(e->localWorldSize == 2);
  CHECK(e->nodeRank == 1);
  CHECK(e->masterAddr == "gpu07");
  CHECK(e->masterPort == 20000 + 123456 % 20000);
  CHECK(describeRankEnv(*e) == "rank 3 of 4 (slurm): node 1, local rank 1 of 2, store at gpu07:23456");
  CHECK(describeRankEnv(*e, "etcd://svc:2379/ddp/slurm-42") ==
        "rank 3 of 4 (slurm): node 1, local rank 1 of 2, store at etcd://svc:2379/ddp/slurm-42");
  auto withPort = rankEnvFromEnvironment(
      {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_ID", "9"}, {"MASTER_PORT", "31000"}});
  REQUIRE(withPort);
  CHECK(withPort->masterPort == 31000);
}

TEST_CASE("SLURM node lists expand in code", "[launcher][env]") {
  using V = std::vector<std::string>;
  CHECK(expandSlurmNodeList("node1") == V{"node1"});
  CHECK(expandSlurmNodeList("node[1-3,5]") == V{"node1", "node2", "node3", "node5"});
  CHECK(expandSlurmNodeList("n[01-03]") == V{"n01", "n02", "n03"});
  CHECK(expandSlurmNodeList("a[1-2],b,c[7]") == V{"a1", "a2", "b", "c7"});
  CHECK(expandSlurmNodeList("rack[1-2]-gpu") == V{"rack1-gpu", "rack2-gpu"});
  CHECK(expandSlurmNodeList("node[9-11]") == V{"node9", "node10", "node11"});
  CHECK_THROWS_WITH(expandSlurmNodeList("node[1-"), Catch::Contains("unclosed"));
  CHECK_THROWS_WITH(expandSlurmNodeList("node[3-1]"), Catch::Contains("backwards"));
  CHECK_THROWS_WITH(expandSlurmNodeList("node[a-b]"), Catch::Contains("not a number range"));
}

TEST_CASE("OpenMPI variables", "[launcher][env]") {
  auto e = rankEnvFromEnvironment({{"OMPI_COMM_WORLD_RANK", "1"},
                                   {"OMPI_COMM_WORLD_SIZE", "2"},
                                   {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                   {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                   {"MASTER_ADDR", "head"},
                                   {"MASTER_PORT", "29999"}});
  REQUIRE(e);
  CHECK(e->source == "openmpi");
  CHECK(e->rank == 1);
  CHECK(e->worldSize == 2);
  CHECK(e->localRank == 1);
  CHECK(e->localWorldSize == 2);
  CHECK(e->masterAddr == "head");
  CHECK(e->masterPort == 29999);
}

TEST_CASE("torchrun variables win over SLURM's", "[launcher][env]") {
  auto e = rankEnvFromEnvironment({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}});
  REQUIRE(e);
  CHECK(e->source == "torchrun");
  CHECK(e->rank == 1);
}

TEST_CASE("OpenMPI on one node needs no MASTER_ADDR or MASTER_PORT", "[launcher][env]") {
  // What mpirun -np 2 sets (OpenMPI 4.1), and no MASTER_*.
  EnvMap mpi = {{"OMPI_COMM_WORLD_RANK", "1"},       {"OMPI_COMM_WORLD_SIZE", "2"},
                {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                {"OMPI_COMM_WORLD_NODE_RANK", "1"},  {"OMPI_MCA_ess_base_jobid", "1869086721"},
                {"PMIX_NAMESPACE", "1869086721"}};
  auto e = rankEnvFromEnvironment(mpi);
  REQUIRE(e);
  CHECK(e->source == "openmpi");
  CHECK(e->masterAddr == "127.0.0.1");
  CHECK(e->masterPort == masterPortFromJobName("1869086721"));
  CHECK(e->masterPort == 24203);  // 20000 + FNV-1a-32("1869086721") % 12000
  CHECK(e->masterPort >= 20000);
  CHECK(e->masterPort < 32000);
  CHECK_THAT(e->masterOrigin, Catch::Contains("all ranks on this node") &&
                                  Catch::Contains("port from the OpenMPI job id 1869086721"));
  // Node 0: OMPI_COMM_WORLD_NODE_RANK (1) is the rank on the node, not the node.
  CHECK(e->nodeRank == 0);
  CHECK(describeRankEnv(*e) == "rank 1 of 2 (openmpi): node 0, local rank 1 of 2, store at 127.0.0.1:" +
                                   std::to_string(e->masterPort) +
                                   " (address: all ranks on this node; port from the OpenMPI job id 1869086721)");
  // Every rank of the job derives the same port.
  mpi["OMPI_COMM_WORLD_RANK"] = "0";
  mpi["OMPI_COMM_WORLD_LOCAL_RANK"] = "0";
  CHECK(rankEnvFromEnvironment(mpi)->masterPort == e->masterPort);
  // Without OpenMPI's job id (OpenMPI 5 / PRRTE), the PMIx namespace names the job.
  mpi.erase("OMPI_MCA_ess_base_jobid");
  mpi["PMIX_NAMESPACE"] = "prterun-node1-4242@1";
  auto p = rankEnvFromEnvironment(mpi);
  CHECK(p->masterPort == masterPortFromJobName("prterun-node1-4242@1"));
  CHECK_THAT(p->masterOrigin, Catch::Contains("PMIX_NAMESPACE prterun-node1-4242@1"));
  // Explicit variables win, and then nothing is said about their origin.
  mpi["MASTER_ADDR"] = "10.0.0.1";
  mpi["MASTER_PORT"] = "29600";
  auto x = rankEnvFromEnvironment(mpi);
  CHECK(x->masterAddr == "10.0.0.1");
  CHECK(x->masterPort == 29600);
  CHECK(x->masterOrigin.empty());
}

TEST_CASE("OpenMPI across nodes needs MASTER_ADDR, and the port still comes from the job", "[launcher][env]") {
  EnvMap mpi = {{"OMPI_COMM_WORLD_RANK", "2"},       {"OMPI_COMM_WORLD_SIZE", "4"},
                {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                {"OMPI_COMM_WORLD_NODE_RANK", "0"},  {"OMPI_MCA_ess_base_jobid", "77"}};
  CHECK_THROWS_AS(rankEnvFromEnvironment(mpi), UsageError);
  CHECK_THROWS_WITH(rankEnvFromEnvironment(mpi),
                    Catch::Contains("MASTER_ADDR is not set") && Catch::Contains("mpirun -x MASTER_ADDR=") &&
                        Catch::Contains("docs/clusters.md#openmpi"));
  mpi["MASTER_ADDR"] = "node1";
  auto e = rankEnvFromEnvironment(mpi);
  REQUIRE(e);
  CHECK(e->masterAddr == "node1");
  CHECK(e->masterPort == masterPortFromJobName("77"));
  CHECK(e->localWorldSize == 2);
  CHECK(e->nodeRank == 1);  // ranks 2 and 3 are the second node's
}

TEST_CASE("ports derived from OpenMPI job ids spread over 20000..31999", "[launcher][env]") {
  // OpenMPI job ids are (job family << 16) | 1: a plain modulo would hit
  // few ports, the hash hits many.
  std::set<int> ports;
  for (uint32_t family = 1; family <= 1000; ++family) {
    const int port = masterPortFromJobName(std::to_string((family << 16) | 1u));
    CHECK(port >= 20000);
    CHECK(port <= 31999);
    ports.insert(port);
  }
  CHECK(ports.size() > 900);
}

// framework/core/strings.hpp, against the hand-written forms it replaces.
TEST_CASE("message helpers: names, numbers, sizes and durations", "[core][strings]") {
  CHECK(joinNames(std::vector<std::string>{"gloo", "nccl", "mpi"}) == "gloo, nccl, mpi");
  CHECK(joinNames(std::vector<std::string>{}).empty());
  CHECK(joinNames(std::vector<int>{1, 2, 4}, ",") == "1,2,4");
  CHECK(joinNames(std::vector<std::string>{"only"}, "; ") == "only");

  // As std::ostream with setprecision(10) writes them (the plugins' showValue).
  for (double v : {0.001, 30.0, 1e-08, 0.9, -2.5, 123456789012.0, 1.0 / 3}) {
    std::ostringstream os;
    os << std::setprecision(10) << v;
    CHECK(showNumber(v) == os.str());
  }

  CHECK(formatFixed(3.14159, 2) == "3.14");
  CHECK(formatFixed(2.0, 0) == "2");
  CHECK(formatFixed(std::nan(""), 3) == "n/a");

  CHECK(formatBytes(4096) == "4 KiB");
  CHECK(formatBytes(1536) == "1536 B");
  CHECK(formatBytes(int64_t{64} << 20) == "64 MiB");
  CHECK(formatBytes(int64_t{3} << 30) == "3 GiB");
  CHECK(formatBytes(int64_t{2048} << 30) == "2048 GiB");
  CHECK(formatBytes(0) == "0 B");

  CHECK(formatSeconds(4.24) == "4.2s");
  CHECK(formatSeconds(59.94) == "59.9s");
  // As the trainer's snprintf wrote "%.1fs" below a minute.
  for (double s : {0.0, 0.05, 1.75, 12.345, 59.0}) {
    char reference[32];
    std::snprintf(reference, sizeof(reference), "%.1fs", s);
    CHECK(formatSeconds(s) == reference);
  }
  CHECK(formatSeconds(185) == "3m05s");
  CHECK(formatSeconds(3725) == "1h02m");
}
