#include "framework/launch/arrival.hpp"

#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "framework/core/errors.hpp"
#include "framework/core/help_links.hpp"
#include "framework/core/strings.hpp"
#include "framework/store/tcp/server.hpp"
#include "framework/store/tcp_store.hpp"

namespace ddp {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kCountKey = "ddp/arrival/count";
constexpr const char* kFailedKey = "ddp/arrival/failed";

struct Record {
  int rank = -1;
  int worldSize = 0;
  int nodeRank = 0;
  std::string host;
};

std::string hostName() {
  char host[256] = {0};
  if (::gethostname(host, sizeof host - 1) != 0) return "?";
  return host;
}

// The store server's last refused handshake (tcp/server.hpp), or "": with
// ranks missing, most likely a node of this job without its token.
std::string lastRefusal(Store& store) {
  try {
    if (!store.check({tcpstore::kLastRefusalKey})) return "";
    return store.getString(tcpstore::kLastRefusalKey);
  } catch (const StoreError&) {
    return "";
  }
}

std::string refusalNote(const std::string& refusal) {
  if (refusal.empty()) return "";
  return fmt::format("; the store refused a client ({}): a node of this job started without this job's {} cannot "
                     "join. HINT: export the same {} (or {}_FILE) on every node",
                     refusal, kStoreTokenEnv, kStoreTokenEnv, kStoreTokenEnv);
}

std::string encode(const Record& r) { return fmt::format("{} {} {} {}", r.rank, r.worldSize, r.nodeRank, r.host); }

Record decode(const std::string& text) {
  Record r;
  std::istringstream in(text);
  in >> r.rank >> r.worldSize >> r.nodeRank >> r.host;
  return r;
}

std::string describe(const Record& r) { return fmt::format("rank {} (node {}, host {})", r.rank, r.nodeRank, r.host); }

// "2,3,5-9": ascending numbers, runs of three or more as a range.
std::string compactList(const std::vector<int>& sorted) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < sorted.size();) {
    size_t j = i;
    while (j + 1 < sorted.size() && sorted[j + 1] == sorted[j] + 1) ++j;
    if (j >= i + 2) {
      parts.push_back(fmt::format("{}-{}", sorted[i], sorted[j]));
    } else {
      for (size_t k = i; k <= j; ++k) parts.push_back(std::to_string(sorted[k]));
    }
    i = j + 1;
  }
  return joinNames(parts, ",");
}

// "ranks 2,3 (node 1)": the ranks not yet arrived, and the nodes they belong
// to as this rank's launcher lays them out (equal nodes).
std::string missingRanks(const RankEnv& env, const std::map<int, Record>& arrived) {
  std::vector<int> ranks;
  std::set<int> nodeSet;
  for (int r = 0; r < env.worldSize; ++r) {
    if (arrived.count(r) != 0) continue;
    ranks.push_back(r);
    nodeSet.insert(r / std::max(1, env.localWorldSize));
  }
  const std::vector<int> nodes(nodeSet.begin(), nodeSet.end());
  return fmt::format("rank{} {} (node{} {})", ranks.size() == 1 ? "" : "s", compactList(ranks),
                     nodes.size() == 1 ? "" : "s", compactList(nodes));
}

// Fails this rank with `message`. Rank 0 serves the store: were it to leave
// at once, the others could lose the store before reading the record that
// tells them what is wrong, and report a lost server instead. So it lingers
// until every rank that announced itself has failed too, 2 s at most.
[[noreturn]] void failArrival(Store& store, const RankEnv& env, const std::string& message) {
  try {
    store.add(kFailedKey, 1);
    if (env.rank == 0) {
      const auto until = Clock::now() + std::chrono::seconds(2);
      while (Clock::now() < until && store.add(kFailedKey, 0) < store.add(kCountKey, 0)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
  } catch (const StoreError&) {
    // The store is gone: nobody is left to tell.
  }
  throw UsageError(message);
}

}  // namespace

bool arrivedBefore(Store& store, int worldSize, int first, int count) {
  const int64_t arrived = store.add(kCountKey, 0);
  for (int64_t i = 0; i < arrived; ++i) {
    const std::string key = fmt::format("ddp/arrival/{}", i);
    if (!store.check({key})) continue;  // counted, not yet written
    const Record r = decode(store.getString(key));
    if (r.worldSize == worldSize && r.rank >= first && r.rank < first + count) return true;
  }
  return false;
}

Arrival awaitArrival(Store& store, const RankEnv& env, const ArrivalOptions& options) {
  Arrival result;
  if (env.worldSize <= 1) return result;
  const auto start = Clock::now();
  const auto deadline = start + options.timeout;
  Record mine{env.rank, env.worldSize, env.nodeRank, hostName()};
  const int64_t index = store.add(kCountKey, 1) - 1;
  store.setString(fmt::format("ddp/arrival/{}", index), encode(mine));

  std::map<int, Record> arrived;  // by rank, records of this world
  auto nextProgress = start + options.progressEvery;
  for (int64_t next = 0; static_cast<int>(arrived.size()) < env.worldSize; ++next) {
    const std::string key = fmt::format("ddp/arrival/{}", next);
    while (true) {
      const auto now = Clock::now();
      if (now >= deadline) {
        const std::string refusal = lastRefusal(store);
        if (!refusal.empty()) {
          fail<StoreTimeout>("rendezvous through {}: {} of {} ranks arrived within {:g} s; still missing {}{}",
                             store.describe(), arrived.size(), env.worldSize,
                             std::chrono::duration<double>(options.timeout).count(), missingRanks(env, arrived),
                             refusalNote(refusal));
        }
        fail<StoreTimeout>(
            "rendezvous through {}: {} of {} ranks arrived within {:g} s; still missing {}. HINT: start every node of "
            "the job (same --nnodes, --master-addr, --master-port); {}",
            store.describe(), arrived.size(), env.worldSize,
            std::chrono::duration<double>(options.timeout).count(), missingRanks(env, arrived),
            kRendezvousHelp);
      }
      const auto until = std::min(deadline, nextProgress);
      try {
        store.wait({key}, std::max(std::chrono::milliseconds(1),
                                   std::chrono::duration_cast<std::chrono::milliseconds>(until - now)));
        break;
      } catch (const StoreTimeout&) {
      }
      if (Clock::now() >= nextProgress) {
        if (env.localRank == 0) {
          // One write: lines of ranks sharing a terminal stay whole.
          std::cerr << fmt::format("rendezvous: {} of {} ranks arrived after {} s; waiting for {}{}\n", arrived.size(),
                                   env.worldSize,
                                   std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - start).count(),
                                   missingRanks(env, arrived), refusalNote(lastRefusal(store)))
                    << std::flush;
        }
        nextProgress += options.progressEvery;
      }
    }
    const Record other = decode(store.getString(key));
    if (other.worldSize != env.worldSize) {
      failArrival(store, env,
                  fmt::format("rendezvous: ranks disagree on the world size: {} has {}, {} has {}. HINT: start every "
                              "node with the same --nnodes and --nproc-per-node (WORLD_SIZE)",
                              describe(mine), env.worldSize, describe(other), other.worldSize));
    }
    auto [it, inserted] = arrived.emplace(other.rank, other);
    if (!inserted) {
      failArrival(store, env,
                  fmt::format("rendezvous: rank {} is claimed twice, by {} and by {}. HINT: give each node its own "
                              "--node-rank (RANK/GROUP_RANK)",
                              other.rank, describe(it->second), describe(other)));
    }
  }
  result.ranksOnHost = static_cast<int>(
      std::count_if(arrived.begin(), arrived.end(), [&](const auto& entry) { return entry.second.host == mine.host; }));
  return result;
}

}  // namespace ddp
