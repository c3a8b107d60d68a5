#include "framework/launch/distributed.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>

#include "framework/comm/backend_registry.hpp"
#include "framework/core/errors.hpp"
#include "framework/launch/arrival.hpp"
#include "framework/launch/rank_env.hpp"
#include "framework/launch/store_token.hpp"
#include "framework/store/etcd_store.hpp"
#include "framework/store/hash_store.hpp"
#include "framework/comm/single_process_group.hpp"
#include "framework/core/log.hpp"
#include "framework/store/c10d_client_store.hpp"
#include "framework/store/prefix_store.hpp"
#include "framework/store/tcp_store.hpp"

namespace ddp {

int elasticMinRanks() {
  const char* value = std::getenv("DDP_MIN_RANKS");
  if (value == nullptr || *value == '\0') return 0;
  char* end = nullptr;
  const long n = std::strtol(value, &end, 10);
  if (*end != '\0' || n < 0 || n > (1 << 20)) {
    fail<UsageError>("DDP_MIN_RANKS={}: expected a number of ranks >= 0. HINT: ddp-run --min-ranks M", value);
  }
  return static_cast<int>(n);
}

namespace {

// A launcher's restart of this rank (ddp-run --max-restarts): each node's
// launcher restarts its ranks when it sees the failure, and a node sees it
// up to a whole collective timeout after another (or once its link is back).
bool restartedByLauncher() { return restartVariable(currentEnvironment(), "DDP_RESTART").value_or(0) > 0; }

}  // namespace

bool elasticJoiner() {
  const char* value = std::getenv("DDP_ELASTIC_JOIN");
  return value != nullptr && std::string(value) == "1";
}

DistributedContext initDistributed(const RankEnv& env, const DistributedOptions& options,
                                   const BackendRegistry& backends) {
  DistributedContext ctx;
  ctx.env = env;
  setLogRank(env.rank);
  const auto start = std::chrono::steady_clock::now();
  // Ranks of other nodes are waited for (and the store reached) as long
  // as the master would be, not just distributed.timeout_s, a collective's
  // bound: other nodes' launchers start when their host does, a busy host
  // loads LibTorch seconds later, and after a failure each node's launcher
  // restarts when it notices, which may be a whole timeout later than this
  // one did, or once its link is back. A short timeout would fail a start
  // on a busy cluster, and spend every restart with the nodes out of step.
  // One node's ranks start together: they keep the timeout.
  const bool otherNodes = env.worldSize > env.localWorldSize || restartedByLauncher();
  const Milliseconds meetWithin =
      otherNodes ? std::max(options.timeout, options.connectTimeout) : options.timeout;
  const char* agentStore = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  if (env.worldSize == 1) {
    ctx.store = std::make_shared<HashStore>();
  } else if (agentStore != nullptr && std::string(agentStore) == "True") {
    // torchrun's agent serves a c10d store at MASTER_ADDR:MASTER_PORT (its
    // static rendezvous): every rank joins it as a client, in a namespace of
    // this attempt, since the store outlives a restart.
    if (!C10dClientStore::available()) {
      fail<UsageError>("torchrun: TORCHELASTIC_USE_AGENT_STORE=True asks the ranks to join the agent's c10d store, "
                       "and this build has no c10d::TCPStore client. HINT: torchrun --rdzv-backend c10d (or "
                       "--standalone), where rank 0 serves the store");
    }
    const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
    const std::string attempt = restart != nullptr && *restart != '\0' ? restart : "0";
    auto agent = std::make_shared<C10dClientStore>(env.masterAddr, static_cast<uint16_t>(env.masterPort),
                                                   options.connectTimeout, options.timeout);
    ctx.store = std::make_shared<PrefixStore>("ddp/attempt_" + attempt, agent);
    logInfo("rendezvous: joined torchrun's agent store at {}:{} (TORCHELASTIC_USE_AGENT_STORE), attempt {}",
            env.masterAddr, env.masterPort, attempt);
  } else if (const char* url = std::getenv("DDP_STORE_URL"); url != nullptr && *url != '\0') {
    // ddp-run --rdzv-backend etcd: every rank is a client of etcd; no rank
    // serves, so no host's loss takes the store with it.
    EtcdStoreOptions eo;
    parseEtcdUrl(url, &eo);
    eo.token = storeTokenFromEnvironment();
    eo.tokenFromEnvironment = false;
    eo.connectTimeout = options.connectTimeout;
    // (Its first requests, the run's lease among them, by meetWithin; the
    // timeout from the arrival on.)
    eo.timeout = meetWithin;
    ctx.store = std::make_shared<EtcdStore>(eo);
  } else {
    TCPStoreOptions so;
    so.host = env.masterAddr;
    so.port = static_cast<uint16_t>(env.masterPort);
    // ddp-run --min-ranks serves the store from the launcher, which
    // outlives any rank (DDP_STORE_SERVED=1).
    const char* served = std::getenv("DDP_STORE_SERVED");
    ctx.storeServedByRank0 = !(served != nullptr && std::string(served) == "1");
    so.isServer = env.rank == 0 && ctx.storeServedByRank0;
    so.token = storeTokenFromEnvironment();
    so.tokenFromEnvironment = false;  // read just now, the file included
    warnWithoutToken(env, so.token);
    // ddp-run's launcher has held the port since it chose it; rank 0 serves
    // on that socket (launcher.cpp), so nobody else can take the port first.
    if (so.isServer) {
      if (const char* fd = std::getenv("DDP_STORE_LISTEN_FD"); fd != nullptr && *fd != '\0') {
        char* end = nullptr;
        const long value = std::strtol(fd, &end, 10);
        if (*end == '\0' && value >= 0 && value < (1 << 20)) so.listenFd = static_cast<int>(value);
        ::unsetenv("DDP_STORE_LISTEN_FD");  // adopted once: a restart in this process binds anew
      }
    }
    so.connectTimeout = options.connectTimeout;
    so.timeout = options.timeout;
    ctx.store = std::make_shared<TCPStore>(so);
    // Elastic under a launcher other than ddp-run (srun, mpirun, torchrun
    // with its own rendezvous): rank 0 serves the store, so its loss ends
    // the job; any other rank's is recovered from (the heartbeat tells the
    // others, as nobody marks it dead).
    if (so.isServer && elasticMinRanks() > 0) {
      logWarn("elastic (DDP_MIN_RANKS={}): the job's store is served by rank 0 (no ddp-run launcher above the ranks, "
              "no DDP_STORE_URL), so losing rank 0 ends the job; other ranks' losses are recovered from. HINT: "
              "DDP_STORE_URL=etcd://HOST:2379/ddp/$SLURM_JOB_ID puts the store in etcd (docs/clusters.md)",
              elasticMinRanks());
    }
  }
  ctx.store->setTimeout(options.timeout);
  // Every rank announces itself before the group forms: a missing node is
  // named every few seconds, and a disagreement on the world size at once,
  // rather than a generic timeout minutes later.
  ProcessGroupOptions po;
  po.timeout = options.timeout;
  po.masterAddr = env.masterAddr;
  po.deviceIndex = env.localRank;  // GPU backends: rank -> cuda:LOCAL_RANK
  ctx.backends = &backends;
  ctx.backend = options.backend;
  ctx.groupOptions = po;
  if (elasticJoiner()) {
    logInfo("rendezvous: store {}: joining a running job (DDP_ELASTIC_JOIN)", ctx.store->describe());
    ctx.ranksOnHost = env.localWorldSize;
    return ctx;
  }
  ArrivalOptions ao;
  ao.timeout = meetWithin;
  ao.progressEvery = options.progressEvery;
  ctx.ranksOnHost = awaitArrival(*ctx.store, env, ao).ranksOnHost;
  if (env.worldSize == 1 && backends.compiledOut(options.backend)) {
    // One rank needs no communication: a build without this backend still
    // runs single-process experiments.
    ctx.group = std::make_shared<SingleProcessGroup>(po);
  } else {
    ctx.group = backends.create(options.backend, ctx.store, env.rank, env.worldSize, po);
  }
  logInfo("rendezvous: store {}, world size {}, backend {}: group ready after {:.3f} s", ctx.store->describe(),
          env.worldSize, ctx.group->backendName(),
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  // Which address the peers reach this rank on: a multi-homed node that
  // picked the wrong interface shows it here (docs/clusters.md).
  if (env.worldSize > 1) {
    const std::string endpoint = ctx.group->describeEndpoint();
    // One write, so that lines of ranks sharing a terminal stay whole.
    if (!endpoint.empty()) {
      std::cerr << fmt::format("{}: rank {} {}\n", ctx.group->backendName(), env.rank, endpoint) << std::flush;
    }
  }
  return ctx;
}

}  // namespace ddp
