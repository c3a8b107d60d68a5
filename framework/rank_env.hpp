// RankEnv: who this process is in the job, read from the environment that
// started it: ddp-run itself, torchrun-style variables, SLURM (srun) or
// OpenMPI (mpirun). docs/clusters.md lists every variable.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ddp {

struct RankEnv {
  int rank = 0;
  int worldSize = 1;
  int localRank = 0;
  int localWorldSize = 1;
  int nodeRank = 0;
  std::string masterAddr = "127.0.0.1";
  int masterPort = 29500;
  std::string source = "single";  // "ddp-run", "torchrun", "slurm", "openmpi" or "single"
};

using EnvMap = std::map<std::string, std::string>;

// The current process environment as a map.
EnvMap currentEnvironment();

// The rank layout the environment describes, or nullopt when it describes
// none (a plain single-process start). Precedence: torchrun-style RANK /
// WORLD_SIZE (ddp-run sets these too), then SLURM, then OpenMPI. Throws
// UsageError naming the variable when one is malformed.
std::optional<RankEnv> rankEnvFromEnvironment(const EnvMap& env);

// Expands a SLURM host list: "node[1-3,5],gpu7" -> node1 node2 node3 node5 gpu7.
// Keeps zero padding ("n[01-02]" -> n01 n02). Throws UsageError on bad syntax.
std::vector<std::string> expandSlurmNodeList(const std::string& list);

// SLURM jobs without MASTER_PORT derive one from the job id, so that all
// tasks agree without talking: 20000 + job_id % 20000.
int masterPortFromSlurmJobId(const std::string& jobId);

// One line for the log of a rank started by srun, mpirun or torchrun:
// "rank 1 of 2 (slurm): node 1, local rank 0 of 1, store at node1:24322".
std::string describeRankEnv(const RankEnv& env);

}  // namespace ddp
