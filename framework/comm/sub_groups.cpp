// Sub-groups and the rank mesh (sub_groups.hpp).
#include "framework/comm/sub_groups.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "framework/core/errors.hpp"
#include "framework/store/prefix_store.hpp"

namespace ddp {

GroupFactory::GroupFactory(std::shared_ptr<Store> store, const BackendRegistry& backends, std::string backend,
                           int rank, int size, ProcessGroupOptions options)
    : store_(std::move(store)),
      backends_(backends),
      backend_(std::move(backend)),
      rank_(rank),
      size_(size),
      options_(std::move(options)) {
  if (size_ < 1 || rank_ < 0 || rank_ >= size_) {
    fail<UsageError>("sub-groups: rank {} of a world of {}", rank_, size_);
  }
}

ProcessGroupPtr GroupFactory::newGroup(std::vector<int> ranks) {
  const int64_t id = next_++;
  std::sort(ranks.begin(), ranks.end());
  if (ranks.empty()) fail<UsageError>("newGroup #{}: no ranks", id);
  if (ranks.front() < 0 || ranks.back() >= size_) {
    fail<UsageError>("newGroup #{}: ranks [{}] go beyond the world of {} (0..{})", id, fmt::join(ranks, ","), size_,
                     size_ - 1);
  }
  if (std::adjacent_find(ranks.begin(), ranks.end()) != ranks.end()) {
    fail<UsageError>("newGroup #{}: rank {} is given twice in [{}]", id,
                     *std::adjacent_find(ranks.begin(), ranks.end()), fmt::join(ranks, ","));
  }
  const auto me = std::find(ranks.begin(), ranks.end(), rank_);
  if (me == ranks.end()) return nullptr;
  auto call = std::make_shared<PrefixStore>(fmt::format("subgroup/{}", id), store_);
  // Every member says which ranks it asked for; all must agree.
  const std::string mine = fmt::format("{}", fmt::join(ranks, ","));
  call->setString(fmt::format("members/{}", rank_), mine);
  for (int peer : ranks) {
    if (peer == rank_) continue;
    const std::string theirs = call->getString(fmt::format("members/{}", peer));
    if (theirs != mine) {
      fail<UsageError>(
          "newGroup #{}: rank {} asked for ranks [{}], rank {} for [{}]. HINT: every rank must call newGroup in the "
          "same order with the same ranks",
          id, rank_, mine, peer, theirs);
    }
  }
  // The group's own keys, under its ranks too: disjoint groups made by one
  // call on different ranks (ranks 0,1 asking for [0,1] while 2,3 ask for
  // [2,3]) stay apart as well.
  auto store = std::make_shared<PrefixStore>(fmt::format("group-{}", mine), call);
  const int groupRank = static_cast<int>(me - ranks.begin());
  return backends_.create(backend_, store, groupRank, static_cast<int>(ranks.size()), options_);
}

RankMesh GroupFactory::mesh(int replicate, int shard) {
  if (replicate < 1 || shard < 1 || int64_t(replicate) * shard != size_) {
    fail<UsageError>("rank mesh {} x {}: needs replicate x shard = the world size {}. HINT: a shard size that "
                     "divides {}",
                     replicate, shard, size_, size_);
  }
  RankMesh mesh;
  mesh.replicate = replicate;
  mesh.shard = shard;
  mesh.row = rank_ / shard;
  mesh.column = rank_ % shard;
  for (int row = 0; row < replicate; ++row) {
    std::vector<int> ranks;
    for (int c = 0; c < shard; ++c) ranks.push_back(row * shard + c);
    if (ProcessGroupPtr group = newGroup(ranks)) mesh.shardGroup = std::move(group);
  }
  for (int column = 0; column < shard; ++column) {
    std::vector<int> ranks;
    for (int r = 0; r < replicate; ++r) ranks.push_back(r * shard + column);
    if (ProcessGroupPtr group = newGroup(ranks)) mesh.replicateGroup = std::move(group);
  }
  return mesh;
}

}  // namespace ddp
