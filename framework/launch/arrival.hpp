// Rendezvous arrival: before a process group forms, every rank announces
// itself in the job's store and waits until every rank of its world has.
//
// Contract
// - Each rank appends one record to the store (its rank, world size, node
//   and host name) and reads the records of the others as they come.
// - While ranks are missing, the first rank of each node (local rank 0)
//   prints one line every `progressEvery` to stderr: how many ranks have
//   arrived and which ranks (and nodes) are awaited, and the client the
//   store server last refused at its handshake (tcp/server.hpp), if any:
//   a node of this job without the job's token.
// - A record whose world size differs from this rank's fails at once with
//   UsageError naming both sizes, ranks, nodes and hosts; so does a rank
//   number claimed twice. Nobody waits for the timeout first.
// - Ranks still missing after `timeout` fail with StoreTimeout naming them
//   (and the refused client, with the fix, when there was one).
// - The result says how many ranks of the job share this rank's host, so
//   that the threads per rank can account for launchers the local one does
//   not know about (several launchers on one host).
// - Costs a few store round trips per rank; a world of one returns at once.
#pragma once

#include <chrono>

#include "framework/launch/rank_env.hpp"
#include "framework/store/store.hpp"

namespace ddp {

struct ArrivalOptions {
  std::chrono::milliseconds timeout{300000};
  std::chrono::milliseconds progressEvery{10000};
};

struct Arrival {
  int ranksOnHost = 1;  // ranks of the job on this host, this one included
};

Arrival awaitArrival(Store& store, const RankEnv& env, const ArrivalOptions& options);

// Whether any of ranks first..first+count-1 of a world of `worldSize` has
// arrived in `store` before: a launcher that finds its own node's ranks
// there starts after them, as a replacement for a lost node (launcher.cpp).
bool arrivedBefore(Store& store, int worldSize, int first, int count);

}  // namespace ddp
