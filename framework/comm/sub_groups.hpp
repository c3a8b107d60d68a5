// Sub-groups: process groups of some of the job's ranks, and the 2-D rank
// mesh that hybrid sharding runs on (shard within a row, replicate along a
// column).
//
// Contract
// - A GroupFactory belongs to one rank of a world of `size` ranks that share
//   `store`; it makes groups of the backend `backend` (BackendRegistry).
// - newGroup(ranks) is collective over the whole world, as c10d's
//   new_group: every rank calls it, in the same order, with the same ranks
//   (any order, no duplicates, each in [0, size)). A member gets a group
//   whose rank r is the r-th smallest of `ranks`; a rank outside gets
//   nullptr. Each group meets through the store under a prefix of its own
//   ("subgroup/<n>/group-<ranks>/", n counting this factory's calls), so
//   collectives of two groups never mix, even where members overlap and
//   both have collectives in flight, or where one call makes disjoint
//   groups on different ranks. Members check that they agree on the ranks: a
//   mismatch is a UsageError naming both lists, on every member, before any
//   group forms. Ranks out of range or given twice: UsageError at once.
// - The backend sees an ordinary group: gloo moves a sub-group's payloads
//   through shared memory when its members share a host, over TCP (and
//   hierarchically by host) otherwise.
// - mesh(replicate, shard) needs replicate * shard == size: rank g sits in
//   row g / shard and column g % shard. It makes every row's group (shard
//   groups: `shard` consecutive ranks, those of one host under a launcher
//   that numbers ranks host by host), then every column's (replicate
//   groups: one rank of each row), and returns this rank's two. 1-wide
//   meshes are allowed (a group of one rank).
// - A sub-group's collectives have the ProcessGroup contract; a failure
//   breaks that group only.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "framework/comm/backend_registry.hpp"
#include "framework/comm/process_group.hpp"
#include "framework/store/store.hpp"

namespace ddp {

struct RankMesh {
  int replicate = 1, shard = 1;        // rows, columns
  int row = 0, column = 0;             // this rank's place
  ProcessGroupPtr shardGroup;          // this rank's row: `shard` ranks
  ProcessGroupPtr replicateGroup;      // this rank's column: `replicate` ranks
};

class GroupFactory {
 public:
  GroupFactory(std::shared_ptr<Store> store, const BackendRegistry& backends, std::string backend, int rank, int size,
               ProcessGroupOptions options = {});

  ProcessGroupPtr newGroup(std::vector<int> ranks);
  RankMesh mesh(int replicate, int shard);

  int rank() const { return rank_; }
  int size() const { return size_; }

 private:
  std::shared_ptr<Store> store_;
  const BackendRegistry& backends_;
  std::string backend_;
  int rank_, size_;
  ProcessGroupOptions options_;
  int64_t next_ = 0;  // groups made so far
};

}  // namespace ddp
