// RankEnv: who this process is in the job, read from the environment that
// started it: ddp-run itself, torchrun-style variables, SLURM (srun) or
// OpenMPI (mpirun). docs/clusters.md lists every variable.
#pragma once

#include <array>
#include <cstdint>
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
  // Where masterAddr and masterPort came from, for the start-up line, e.g.
  // "port from the OpenMPI job id 1869086721". Empty: from MASTER_ADDR/MASTER_PORT or defaults.
  std::string masterOrigin;
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

// OpenMPI jobs without MASTER_PORT derive one from the job's name
// (OMPI_MCA_ess_base_jobid, else PMIX_NAMESPACE), the same on every rank and
// node: 20000 + FNV-1a(name) % 12000, i.e. 20000..31999, below Linux's
// ephemeral ports (32768+). Hashed, since OpenMPI job ids are family << 16 | n.
int masterPortFromJobName(const std::string& jobName);

// SLURM jobs without MASTER_PORT derive one from the job id, so that all
// tasks agree without talking: 20000 + job_id % 20000.
int masterPortFromSlurmJobId(const std::string& jobId);

// The launchers' restart counters, the nearest launcher first: ddp-run
// --max-restarts (DDP_RESTART, set even at 0, so that ddp-run inside a
// requeued SLURM job counts its own), torchrun --max-restarts
// (TORCHELASTIC_RESTART_COUNT), a requeued SLURM job (SLURM_RESTART_COUNT).
inline constexpr std::array<const char*, 3> kRestartVariables = {"DDP_RESTART", "TORCHELASTIC_RESTART_COUNT",
                                                                 "SLURM_RESTART_COUNT"};

// One of those counters: nullopt when it is unset or empty; 0 when it is
// not a positive integer (a counter is advisory: it never stops a start).
std::optional<int64_t> restartVariable(const EnvMap& env, const std::string& name);

// Whether any launcher restarted this process: one of the counters is above
// 0. A restart continues from the newest checkpoint and injects no fault.
bool restartedByAnyLauncher(const EnvMap& env);

// Which restart this process is, by the nearest launcher that counts (the
// first counter set): 0 on a first attempt. steps.jsonl's "restart".
int64_t restartCount(const EnvMap& env);

// One line for the log of a rank started by srun, mpirun or torchrun:
// "rank 1 of 2 (slurm): node 1, local rank 0 of 1, store at node1:24322",
// followed by "(<masterOrigin>)" when the master was derived. A store
// named by URL (DDP_STORE_URL, e.g. etcd://svc:2379/ddp/slurm-42) is named
// instead of MASTER_ADDR:MASTER_PORT, which then only picks the interface.
std::string describeRankEnv(const RankEnv& env, const std::string& storeUrl = "");

}  // namespace ddp
