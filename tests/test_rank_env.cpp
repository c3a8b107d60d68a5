// Rank layouts from torchrun-style variables, SLURM and OpenMPI.
#include <catch2/catch.hpp>

#include "framework/errors.hpp"
#include "framework/rank_env.hpp"

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
