// Distributed start-up for one rank: the TCPStore at MASTER_ADDR:MASTER_PORT
// (served by rank 0) and the process group of the chosen backend.
#pragma once

#include <memory>
#include <string>

#include "framework/comm/backend_registry.hpp"
#include "framework/comm/process_group.hpp"
#include "framework/launch/rank_env.hpp"
#include "framework/store/store.hpp"

namespace ddp {

struct DistributedOptions {
  std::string backend = "gloo";
  Milliseconds timeout{300000};       // collectives
  Milliseconds connectTimeout{60000};  // reaching the master
  Milliseconds progressEvery{10000};   // a line on who is awaited, while ranks wait for each other
};

struct DistributedContext {
  RankEnv env;
  std::shared_ptr<Store> store;
  ProcessGroupPtr group;  // null for a process that joins a running job (elastic)
  int ranksOnHost = 1;  // ranks of the job on this host (all launchers), this one included
  // The job's store is the TCP store that rank 0 serves in its own process
  // (no ddp-run launcher above the ranks, no etcd, no torchrun agent store):
  // losing rank 0 ends the job.
  bool storeServedByRank0 = false;
  // What another group of this job is made with (elastic recovery).
  const BackendRegistry* backends = nullptr;
  std::string backend;
  ProcessGroupOptions groupOptions;
};

// Elastic training (launch/elastic.hpp), from the environment ddp-run (or
// the user, under other launchers) sets: DDP_MIN_RANKS (0 or unset: off),
// and DDP_ELASTIC_JOIN=1 for a process that joins a running job.
int elasticMinRanks();
bool elasticJoiner();

// A joiner (elasticJoiner()) connects to the store only: its group comes
// from the elastic rendezvous. World size 1 with no master needed uses an in-memory store. Before the
// group forms, ranks meet in the store (arrival.hpp): a missing rank is named
// every `progressEvery`, ranks that disagree on the world size fail at once.
// Ranks wait for each other `timeout` on one node; with ranks on other nodes
// (worldSize > localWorldSize), or in a restart by ddp-run (DDP_RESTART > 0),
// max(timeout, connectTimeout), since nodes start and restart at their own
// pace; an etcd store is reached within the same bound. Names this
// rank in later log lines (setLogRank) and, at DDP_LOG_LEVEL=info, logs the
// rendezvous: store address, world size, backend, and how long the group
// took to form.
// `backends` names the ProcessGroup implementations to choose from (a
// program with the built-in ones passes ddp::builtinBackends()).
DistributedContext initDistributed(const RankEnv& env, const DistributedOptions& options,
                                   const BackendRegistry& backends);

}  // namespace ddp
