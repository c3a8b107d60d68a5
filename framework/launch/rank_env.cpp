#include "framework/launch/rank_env.hpp"

#include <cctype>
#include <cstdint>
#include <cstdlib>

#include "framework/core/errors.hpp"
#include "framework/core/strings.hpp"

extern char** environ;

namespace ddp {
namespace {

const std::string* find(const EnvMap& env, const std::string& key) {
  auto it = env.find(key);
  return it == env.end() || it->second.empty() ? nullptr : &it->second;
}

int parseInt(const EnvMap& env, const std::string& key, int fallback, bool required = false) {
  const std::string* v = find(env, key);
  if (!v) {
    if (required) fail<UsageError>("environment: {} is not set", key);
    return fallback;
  }
  char* end = nullptr;
  long x = std::strtol(v->c_str(), &end, 10);
  if (end == v->c_str() || *end != '\0' || x < 0 || x > 1000000) {
    fail<UsageError>("environment: {}='{}' is not a non-negative integer", key, *v);
  }
  return static_cast<int>(x);
}

void validate(const RankEnv& e, const std::string& rankVar, const std::string& sizeVar) {
  if (e.worldSize < 1) fail<UsageError>("environment: {} must be at least 1", sizeVar);
  if (e.rank >= e.worldSize) {
    fail<UsageError>("environment: {}={} is not below {}={}", rankVar, e.rank, sizeVar, e.worldSize);
  }
  if (e.masterPort < 1 || e.masterPort > 65535) {
    fail<UsageError>("environment: MASTER_PORT={} is not a TCP port (1-65535)", e.masterPort);
  }
}

}  // namespace

EnvMap currentEnvironment() {
  EnvMap env;
  for (char** p = environ; p && *p; ++p) {
    std::string kv(*p);
    auto eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return env;
}

std::optional<RankEnv> rankEnvFromEnvironment(const EnvMap& env) {
  RankEnv e;
  if (find(env, "RANK") && find(env, "WORLD_SIZE")) {
    e.source = find(env, "DDP_RUN_LAUNCHED") ? "ddp-run" : "torchrun";
    e.rank = parseInt(env, "RANK", 0, true);
    e.worldSize = parseInt(env, "WORLD_SIZE", 1, true);
    e.localRank = parseInt(env, "LOCAL_RANK", e.rank);
    e.localWorldSize = parseInt(env, "LOCAL_WORLD_SIZE", e.worldSize);
    e.nodeRank = parseInt(env, "GROUP_RANK", parseInt(env, "NODE_RANK", e.rank / std::max(1, e.localWorldSize)));
    if (const std::string* a = find(env, "MASTER_ADDR")) e.masterAddr = *a;
    e.masterPort = parseInt(env, "MASTER_PORT", 29500);
    validate(e, "RANK", "WORLD_SIZE");
    return e;
  }
  if (find(env, "SLURM_PROCID") && find(env, "SLURM_NTASKS")) {
    e.source = "slurm";
    e.rank = parseInt(env, "SLURM_PROCID", 0, true);
    e.worldSize = parseInt(env, "SLURM_NTASKS", 1, true);
    e.localRank = parseInt(env, "SLURM_LOCALID", 0);
    e.nodeRank = parseInt(env, "SLURM_NODEID", 0);
    // SLURM_NTASKS_PER_NODE may read "2" or "2(x3)"; the leading number is ours.
    if (const std::string* t = find(env, "SLURM_NTASKS_PER_NODE")) {
      e.localWorldSize = std::max(1, std::atoi(t->c_str()));
    } else {
      int nodes = parseInt(env, "SLURM_NNODES", 1);
      e.localWorldSize = std::max(1, e.worldSize / std::max(1, nodes));
    }
    if (const std::string* a = find(env, "MASTER_ADDR")) {
      e.masterAddr = *a;
    } else if (const std::string* list = find(env, "SLURM_JOB_NODELIST")) {
      e.masterAddr = expandSlurmNodeList(*list).at(0);
    } else if (const std::string* list2 = find(env, "SLURM_NODELIST")) {
      e.masterAddr = expandSlurmNodeList(*list2).at(0);
    }
    if (find(env, "MASTER_PORT")) {
      e.masterPort = parseInt(env, "MASTER_PORT", 29500);
    } else if (const std::string* job = find(env, "SLURM_JOB_ID")) {
      e.masterPort = masterPortFromSlurmJobId(*job);
    }
    validate(e, "SLURM_PROCID", "SLURM_NTASKS");
    return e;
  }
  if (find(env, "OMPI_COMM_WORLD_RANK") && find(env, "OMPI_COMM_WORLD_SIZE")) {
    e.source = "openmpi";
    e.rank = parseInt(env, "OMPI_COMM_WORLD_RANK", 0, true);
    e.worldSize = parseInt(env, "OMPI_COMM_WORLD_SIZE", 1, true);
    e.localRank = parseInt(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0);
    e.localWorldSize = parseInt(env, "OMPI_COMM_WORLD_LOCAL_SIZE", e.worldSize);
    // Not OMPI_COMM_WORLD_NODE_RANK: despite its name it is the process's
    // rank among those on its node (mpirun -np 2 on one node sets 0 and 1).
    // Nodes hold equal blocks of ranks, as mpirun places them by default.
    e.nodeRank = e.rank / std::max(1, e.localWorldSize);
    // mpirun names no master. All ranks on this node: rank 0 is here too, so
    // loopback reaches it; across nodes the user must say where rank 0 runs.
    std::vector<std::string> origin;
    if (const std::string* a = find(env, "MASTER_ADDR")) {
      e.masterAddr = *a;
    } else if (e.localWorldSize == e.worldSize) {
      e.masterAddr = "127.0.0.1";
      origin.push_back("address: all ranks on this node");
    } else {
      fail<UsageError>("environment: this OpenMPI job spans several nodes (OMPI_COMM_WORLD_LOCAL_SIZE={} of "
                       "OMPI_COMM_WORLD_SIZE={}) and MASTER_ADDR is not set. HINT: mpirun -x MASTER_ADDR=<host of "
                       "rank 0> ...; see docs/clusters.md#openmpi",
                       e.localWorldSize, e.worldSize);
    }
    if (find(env, "MASTER_PORT")) {
      e.masterPort = parseInt(env, "MASTER_PORT", 29500);
    } else if (const std::string* job = find(env, "OMPI_MCA_ess_base_jobid")) {
      e.masterPort = masterPortFromJobName(*job);
      origin.push_back(fmt::format("port from the OpenMPI job id {}", *job));
    } else if (const std::string* ns = find(env, "PMIX_NAMESPACE")) {
      e.masterPort = masterPortFromJobName(*ns);
      origin.push_back(fmt::format("port from PMIX_NAMESPACE {}", *ns));
    }
    e.masterOrigin = joinNames(origin, "; ");
    validate(e, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE");
    return e;
  }
  return std::nullopt;
}

std::vector<std::string> expandSlurmNodeList(const std::string& list) {
  auto bad = [&](const std::string& why) {
    return UsageError(fmt::format("SLURM node list '{}': {}", list, why));
  };
  std::vector<std::string> hosts;
  size_t i = 0;
  while (i < list.size()) {
    std::string prefix;
    while (i < list.size() && list[i] != ',' && list[i] != '[') prefix += list[i++];
    if (i < list.size() && list[i] == '[') {
      size_t close = list.find(']', i);
      if (close == std::string::npos) throw bad("unclosed '['");
      std::string ranges = list.substr(i + 1, close - i - 1);
      i = close + 1;
      std::string suffix;
      while (i < list.size() && list[i] != ',') suffix += list[i++];
      if (suffix.find('[') != std::string::npos) throw bad("more than one bracket per host is not supported");
      size_t start = 0;
      while (start <= ranges.size()) {
        size_t comma = ranges.find(',', start);
        std::string part = ranges.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        if (part.empty()) throw bad("empty range");
        size_t dash = part.find('-');
        std::string lo = part.substr(0, dash), hi = dash == std::string::npos ? lo : part.substr(dash + 1);
        for (char c : lo + hi) {
          if (!std::isdigit(static_cast<unsigned char>(c))) throw bad(fmt::format("'{}' is not a number range", part));
        }
        if (lo.empty() || hi.empty()) throw bad(fmt::format("'{}' is not a number range", part));
        long a = std::stol(lo), b = std::stol(hi);
        if (b < a) throw bad(fmt::format("range '{}' runs backwards", part));
        for (long x = a; x <= b; ++x) {
          // Zero-padded to the width of the range's low end: [01-10] -> 01..10.
          hosts.push_back(fmt::format("{}{:0{}}{}", prefix, x, lo.size(), suffix));
        }
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
    } else if (!prefix.empty()) {
      hosts.push_back(prefix);
    }
    if (i < list.size() && list[i] == ',') ++i;
  }
  if (hosts.empty()) throw bad("no hosts");
  return hosts;
}

int masterPortFromJobName(const std::string& jobName) {
  uint32_t h = 2166136261u;  // FNV-1a, 32 bits
  for (unsigned char c : jobName) {
    h ^= c;
    h *= 16777619u;
  }
  return static_cast<int>(20000 + h % 12000);
}

int masterPortFromSlurmJobId(const std::string& jobId) {
  char* end = nullptr;
  unsigned long id = std::strtoul(jobId.c_str(), &end, 10);
  if (end == jobId.c_str()) fail<UsageError>("environment: SLURM_JOB_ID='{}' is not a number", jobId);
  return static_cast<int>(20000 + id % 20000);
}

std::optional<int64_t> restartVariable(const EnvMap& env, const std::string& name) {
  const std::string* v = find(env, name);
  if (!v) return std::nullopt;
  char* end = nullptr;
  const long long n = std::strtoll(v->c_str(), &end, 10);
  return end != v->c_str() && *end == '\0' && n > 0 ? n : 0;
}

bool restartedByAnyLauncher(const EnvMap& env) {
  for (const char* name : kRestartVariables) {
    if (restartVariable(env, name).value_or(0) > 0) return true;
  }
  return false;
}

int64_t restartCount(const EnvMap& env) {
  for (const char* name : kRestartVariables) {
    if (auto n = restartVariable(env, name)) return *n;
  }
  return 0;
}

std::string describeRankEnv(const RankEnv& e, const std::string& storeUrl) {
  const std::string store =
      !storeUrl.empty() ? storeUrl
                        : fmt::format("{}:{}{}", e.masterAddr, e.masterPort,
                                      e.masterOrigin.empty() ? "" : fmt::format(" ({})", e.masterOrigin));
  return fmt::format("rank {} of {} ({}): node {}, local rank {} of {}, store at {}", e.rank, e.worldSize, e.source,
                     e.nodeRank, e.localRank, e.localWorldSize, store);
}

}  // namespace ddp
