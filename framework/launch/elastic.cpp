// The elastic membership protocol (elastic.hpp) over the job's store.
#include "framework/launch/elastic.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "framework/core/errors.hpp"
#include "framework/core/log.hpp"
#include "framework/core/system.hpp"
#include "framework/store/prefix_store.hpp"

namespace ddp {
namespace {

using ElasticClock = std::chrono::steady_clock;

std::string genKey(int64_t generation, const std::string& what) {
  return fmt::format("elastic/g{}/{}", generation, what);
}
std::string deadKey(int id) { return fmt::format("elastic/dead/{}", id); }
std::string joinKey(int id) { return fmt::format("elastic/join/{}", id); }
std::string admittedKey(int id) { return fmt::format("elastic/admitted/{}", id); }
std::string whereKey(int id) { return fmt::format("elastic/where/{}", id); }
std::string aliveKey(int id) { return fmt::format("elastic/alive/{}", id); }
std::string claimKey(int64_t request) { return fmt::format("elastic/join-claim/{}", request); }
// admittedKey's value for a join request refused: a member holds its id.
constexpr const char* kRefused = "refused";

std::string thisHost() {
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  return host;
}

// "HOST PID" of this process, for a coordinator on the same host.
std::string whereText() { return fmt::format("{} {}", thisHost(), static_cast<int>(::getpid())); }

std::string encodeMembership(const ElasticMembership& m) {
  nlohmann::json j;
  j["generation"] = m.generation;
  j["ids"] = m.ids;
  j["incarnations"] = m.incarnations;
  j["requests"] = m.requests;
  j["source"] = m.sourceId;
  j["source_steps"] = m.sourceSteps;
  j["below_minimum"] = m.belowMinimum;
  j["probe_links"] = m.probeLinks;
  j["timeouts_at_step"] = m.timeoutsAtStep;
  return j.dump();
}

ElasticMembership decodeMembership(const std::string& text) {
  const auto j = nlohmann::json::parse(text);
  ElasticMembership m;
  m.generation = j["generation"];
  m.ids = j["ids"].get<std::vector<int>>();
  m.incarnations = j["incarnations"].get<std::vector<int64_t>>();
  m.requests = j.value("requests", std::vector<int64_t>());  // none: ids alone decide (isMember)
  m.sourceId = j["source"];
  m.sourceSteps = j["source_steps"];
  m.belowMinimum = j["below_minimum"];
  m.probeLinks = j.value("probe_links", false);
  m.timeoutsAtStep = j.value("timeouts_at_step", 0);
  return m;
}

// A counter's value without changing it (absent: 0).
int64_t counter(Store& store, const std::string& key) { return store.add(key, 0); }

}  // namespace

int ElasticMembership::rankOf(int id) const {
  const auto it = std::find(ids.begin(), ids.end(), id);
  return it == ids.end() ? -1 : static_cast<int>(it - ids.begin());
}

// The thread that adds 1 to "elastic/alive/<id>" every period. It holds
// the store and this state, so the rendezvous can go without waiting for
// a request in flight (a store that cannot be reached: the thread ends at
// its next wake, or with the process).
struct ElasticRendezvous::Heartbeat {
  std::mutex mutex;
  std::condition_variable wake;
  bool stop = false;
  bool done = false;  // the thread has let go of the store
};

ElasticRendezvous::ElasticRendezvous(std::shared_ptr<Store> store, int id, ElasticOptions options)
    : store_(std::move(store)), id_(id), options_(options) {
  if (options_.heartbeat.count() > 0 && options_.silentAfter.count() > 0 &&
      options_.silentAfter < 4 * options_.heartbeat) {
    fail<UsageError>("elastic: silentAfter {} ms is under 4 heartbeats of {} ms: a member would be left out for one "
                     "late beat",
                     options_.silentAfter.count(), options_.heartbeat.count());
  }
  if (id_ < 0) return;
  // Where this incarnation runs: a coordinator on the same host sees it
  // exiting before the launcher has reaped it (processExiting).
  store_->setString(whereKey(id_), whereText());
  if (options_.heartbeat.count() <= 0) return;
  heartbeat_ = std::make_shared<Heartbeat>();
  std::thread([beat = heartbeat_, store = store_, key = aliveKey(id_), period = options_.heartbeat]() mutable {
    bool reported = false;
    std::unique_lock<std::mutex> lock(beat->mutex);
    while (!beat->stop) {
      lock.unlock();
      try {
        store->add(key, 1);
        reported = false;
      } catch (const std::exception& e) {
        // Out of reach: the others will find this member silent.
        if (!reported) logWarn("elastic: heartbeat {} in store {}: {}", key, store->describe(), e.what());
        reported = true;
      }
      lock.lock();
      beat->wake.wait_for(lock, period, [&] { return beat->stop; });
    }
    lock.unlock();
    store.reset();
    lock.lock();
    beat->done = true;
    beat->wake.notify_all();
  }).detach();
}

ElasticRendezvous::~ElasticRendezvous() {
  if (!heartbeat_) return;
  std::unique_lock<std::mutex> lock(heartbeat_->mutex);
  heartbeat_->stop = true;
  heartbeat_->wake.notify_all();
  // Normally at once; a beat stuck in a store that does not answer is left
  // to end on its own (it holds only its own references).
  heartbeat_->wake.wait_for(lock, 2 * options_.heartbeat + std::chrono::milliseconds(100),
                            [&] { return heartbeat_->done; });
}

bool ElasticRendezvous::silentFor(int id, std::chrono::milliseconds window) {
  if (options_.heartbeat.count() <= 0 || window.count() <= 0) return false;
  const int64_t beat = counter(*store_, aliveKey(id));
  const auto now = ElasticClock::now();
  Observed& seen = observed_[id];
  // This process looked away (a stall, a slow pass over many members, or a
  // new watch): what it did not see, it does not count as silence.
  const bool watcherAway = now - seen.read > std::max<std::chrono::milliseconds>(2 * options_.heartbeat,
                                                                                 options_.silentAfter / 2);
  seen.read = now;
  if (beat != seen.beat || watcherAway) {
    seen.beat = beat;
    seen.changed = now;
    return false;
  }
  // A member that never beat is still starting (its heartbeat begins with
  // its rendezvous): the settle time decides about it.
  return beat > 0 && now - seen.changed >= window;
}

std::optional<int> ElasticRendezvous::lostMember(const ElasticMembership& membership, std::chrono::milliseconds window) {
  // Never shorter than the rendezvous's own bound: a heartbeat a few beats
  // late is not a lost member.
  window = std::max(window, options_.silentAfter);
  for (int id : membership.ids) {
    if (id != id_ && silentFor(id, window)) return id;
  }
  return std::nullopt;
}

bool ElasticRendezvous::superseded(const ElasticMembership& current) {
  const std::string key = genKey(current.generation + 1, "members");
  if (!store_->check({key})) return false;  // not decided: this member may still be in it
  return !isMember(decodeMembership(store_->getString(key)));
}

bool ElasticRendezvous::isMember(const ElasticMembership& m) const {
  const int rank = m.rankOf(id_);
  if (rank < 0) return false;
  return static_cast<size_t>(rank) >= m.requests.size() || m.requests[static_cast<size_t>(rank)] == request_;
}

std::string ElasticRendezvous::whereOf(int id) {
  try {
    if (store_->check({whereKey(id)})) {
      const std::string where = store_->getString(whereKey(id));
      const auto space = where.rfind(' ');
      if (space != std::string::npos) return fmt::format("host {}, pid {}", where.substr(0, space), where.substr(space + 1));
    }
  } catch (const StoreError&) {
  }
  return "where unknown";
}

bool ElasticRendezvous::exiting(int id) {
  if (!store_->check({whereKey(id)})) return false;
  const std::string where = store_->getString(whereKey(id));
  const auto space = where.rfind(' ');
  if (space == std::string::npos || where.substr(0, space) != thisHost()) return false;
  return processExiting(std::atoi(where.c_str() + space + 1));
}

ElasticMembership ElasticRendezvous::initial(int world) const {
  ElasticMembership m;
  for (int i = 0; i < world; ++i) m.ids.push_back(i);
  m.incarnations.assign(static_cast<size_t>(world), 0);
  m.requests.assign(static_cast<size_t>(world), 0);
  m.sourceId = 0;
  return m;
}

std::shared_ptr<Store> ElasticRendezvous::groupStore(int64_t generation) const {
  if (generation == 0) return store_;
  return std::make_shared<PrefixStore>(genKey(generation, "pg"), store_);
}

void ElasticRendezvous::markDead(Store& store, int id) { store.add(deadKey(id), 1); }

bool ElasticRendezvous::anyAlive(Store& store, const std::vector<int>& ids, std::chrono::milliseconds window) {
  std::vector<int64_t> before;
  for (int id : ids) before.push_back(counter(store, aliveKey(id)));
  const auto until = ElasticClock::now() + window;
  while (ElasticClock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    for (size_t i = 0; i < ids.size(); ++i) {
      if (counter(store, aliveKey(ids[i])) != before[i]) return true;
    }
  }
  return false;
}

int64_t ElasticRendezvous::joinsPending() {
  return std::max<int64_t>(0, counter(*store_, "elastic/join-requests") - counter(*store_, "elastic/join-admitted"));
}

ElasticMembership ElasticRendezvous::next(const ElasticMembership& current, int64_t steps, bool timedOut) {
  const int64_t generation = current.generation + 1;
  // Before the arrival: whoever sees this member arrived sees why.
  if (timedOut) store_->setString(genKey(generation, fmt::format("timedout/{}", id_)), "1");
  store_->setString(genKey(generation, fmt::format("id/{}", id_)), std::to_string(steps));
  if (store_->add(genKey(generation, "arrived"), 1) == 1) return decide(generation, current);
  return awaitDecision(generation);
}

ElasticMembership ElasticRendezvous::decide(int64_t generation, const ElasticMembership& previous) {
  const auto deadline = ElasticClock::now() + options_.settle;
  const auto arrivedKey = [&](int id) { return genKey(generation, fmt::format("id/{}", id)); };
  std::vector<bool> arrived(previous.ids.size(), false), dead(previous.ids.size(), false),
      quiet(previous.ids.size(), false);
  for (bool last = false;;) {
    bool waiting = false;
    for (size_t i = 0; i < previous.ids.size(); ++i) {
      if (arrived[i] || dead[i]) continue;
      const int id = previous.ids[i];
      // A silent member that arrives after all, before the decision, is in.
      if (store_->check({arrivedKey(id)})) {
        arrived[i] = true;
        quiet[i] = false;
      } else if (quiet[i]) {
        continue;
      } else if (counter(*store_, deadKey(id)) > previous.incarnations[i] || exiting(id)) {
        dead[i] = true;
      } else if (last) {
        continue;
      } else if (silent(id)) {
        quiet[i] = true;
      } else {
        waiting = true;
      }
    }
    if (last) break;
    if (!waiting || ElasticClock::now() >= deadline) {
      last = true;  // one more look for late arrivals among the silent ones
      continue;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ElasticMembership m;
  m.generation = generation;
  m.sourceSteps = -1;
  struct Member {
    int id;
    int64_t incarnation, request;
  };
  std::vector<Member> members;
  for (size_t i = 0; i < previous.ids.size(); ++i) {
    const int id = previous.ids[i];
    if (!arrived[i]) {
      if (dead[i]) {
        logInfo("elastic: generation {}: rank id {} died", generation, id);
      } else if (quiet[i]) {
        logWarn("elastic: generation {}: rank id {} ({}) neither arrived nor died, and its heartbeat in store {} stood "
                "still for {:.1f} s (its host lost or cut off, or the process stopped?): left out",
                generation, id, whereOf(id), store_->describe(), options_.silentAfter.count() / 1000.0);
      } else {
        logWarn("elastic: generation {}: rank id {} ({}) neither arrived nor died within {:.1f} s (hung?): left out",
                generation, id, whereOf(id), options_.settle.count() / 1000.0);
      }
      continue;
    }
    members.push_back({id, previous.incarnations[i], i < previous.requests.size() ? previous.requests[i] : 0});
    const int64_t steps = std::stoll(store_->getString(arrivedKey(id)));
    if (steps > m.sourceSteps || (steps == m.sourceSteps && id < m.sourceId)) {
      m.sourceSteps = steps;
      m.sourceId = id;
    }
  }
  // Joiners: ids that asked and are not members now (a dead member's id
  // that comes back included). A request under the id of a member that
  // arrived (the original of a replaced node, started again by its
  // launcher) is refused: that id is taken.
  std::vector<int> joiners;
  for (int id = 0; id < options_.maxId; ++id) {
    if (!store_->check({joinKey(id)})) continue;
    const std::string request = store_->getString(joinKey(id));
    if (request == "0") continue;
    // A joiner that gave up claimed its request first: withdrawn.
    if (store_->add(claimKey(std::stoll(request)), 1) != 1) continue;
    store_->setString(joinKey(id), "0");
    store_->add("elastic/join-admitted", 1);
    if (std::any_of(members.begin(), members.end(), [&](const Member& p) { return p.id == id; })) {
      store_->setString(admittedKey(id), kRefused);
      logWarn("elastic: generation {}: rank id {} asks to join, but a member holds that id: refused", generation, id);
      continue;
    }
    members.push_back({id, counter(*store_, deadKey(id)), std::stoll(request)});
    joiners.push_back(id);
    logInfo("elastic: generation {}: rank id {} joins", generation, id);
  }
  // No sort: the members keep their order, joiners after them, so rank 0
  // (the run folder's writer) stays with the member that holds it, and a
  // joiner (a replaced node 0's rank id 0 among them) never takes it over.
  for (const Member& member : members) {
    m.ids.push_back(member.id);
    m.incarnations.push_back(member.incarnation);
    m.requests.push_back(member.request);
  }
  m.belowMinimum = m.world() < options_.minRanks;
  const bool allArrived = std::all_of(arrived.begin(), arrived.end(), [](bool a) { return a; });
  m.probeLinks = allArrived && joiners.empty() &&
                 std::any_of(previous.ids.begin(), previous.ids.end(), [&](int id) {
                   return store_->check({genKey(generation, fmt::format("timedout/{}", id))});
                 });
  if (m.probeLinks) {
    m.timeoutsAtStep =
        previous.probeLinks && previous.sourceSteps == m.sourceSteps ? previous.timeoutsAtStep + 1 : 1;
  }
  store_->setString(genKey(generation, "members"), encodeMembership(m));
  for (int id : joiners) store_->setString(admittedKey(id), std::to_string(generation));
  store_->setString("elastic/generation", std::to_string(generation));
  if (!isMember(m)) throw ElasticExcluded("elastic: this rank is not in the new membership");
  return m;
}

ElasticMembership ElasticRendezvous::awaitDecision(int64_t generation) {
  store_->wait({genKey(generation, "members")}, options_.decisionTimeout);
  ElasticMembership m = decodeMembership(store_->getString(genKey(generation, "members")));
  if (!isMember(m)) {
    throw ElasticExcluded(fmt::format(
        "elastic: rank id {} arrived at generation {} after its membership was decided (members {}{}); it is left "
        "out",
        id_, generation, fmt::join(m.ids, ","),
        m.rankOf(id_) >= 0 ? fmt::format("; id {} there is a replacement admitted meanwhile", id_) : ""));
  }
  return m;
}

void ElasticRendezvous::awaitMembers(const ElasticMembership& m) {
  store_->setString(genKey(m.generation, fmt::format("ready/{}", id_)), "1");
  const auto deadline = ElasticClock::now() + options_.settle;
  for (;;) {
    bool waiting = false;
    for (size_t i = 0; i < m.ids.size(); ++i) {
      if (store_->check({genKey(m.generation, fmt::format("ready/{}", m.ids[i]))})) continue;
      if (counter(*store_, deadKey(m.ids[i])) > m.incarnations[i] || exiting(m.ids[i])) {
        fail<std::runtime_error>("elastic: rank id {} died while generation {} formed", m.ids[i], m.generation);
      }
      if (silent(m.ids[i])) {
        fail<std::runtime_error>("elastic: rank id {} ({}) fell silent (no heartbeat for {:.1f} s) while generation {} "
                                 "formed",
                                 m.ids[i], whereOf(m.ids[i]), options_.silentAfter.count() / 1000.0, m.generation);
      }
      waiting = true;
    }
    if (!waiting) return;
    if (ElasticClock::now() >= deadline) {
      fail<std::runtime_error>("elastic: generation {}: not every member was ready within {:.1f} s", m.generation,
                               options_.settle.count() / 1000.0);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

ElasticMembership ElasticRendezvous::join() {
  const auto refused = [&] {
    throw ElasticExcluded(fmt::format(
        "elastic: rank id {} asked to join, but another process holds that id in the job (a replacement started "
        "in its place while it was cut off or stopped); it stays out",
        id_));
  };
  store_->setString(admittedKey(id_), "-1");
  // This request's number: the coordinator that admits it and this rank
  // giving up on it both claim it (claimKey), and only the first claim
  // counts, so a request is either admitted or withdrawn, never both.
  const int64_t request = store_->add("elastic/join-seq", 1);
  request_ = request;  // what the membership that admits it names
  store_->setString(joinKey(id_), std::to_string(request));
  store_->add("elastic/join-requests", 1);
  const auto deadline = ElasticClock::now() + options_.decisionTimeout;
  const auto admission = [&]() -> ElasticMembership {
    // Claimed by a coordinator: its decision names this rank; wait for it.
    for (;;) {
      const std::string admitted = store_->getString(admittedKey(id_));
      if (admitted == kRefused) refused();
      if (admitted != "-1") return awaitDecision(std::stoll(admitted));
      if (ElasticClock::now() >= deadline + options_.decisionTimeout) {
        fail<std::runtime_error>("elastic: rank id {} was admitted but its generation was not announced within {} s",
                                 id_, options_.decisionTimeout.count() / 1000);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  };
  for (;;) {
    const std::string admitted = store_->getString(admittedKey(id_));
    if (admitted == kRefused) refused();
    if (admitted != "-1") return awaitDecision(std::stoll(admitted));
    const bool over = finished();
    if (over || ElasticClock::now() >= deadline) {
      if (store_->add(claimKey(request), 1) != 1) return admission();
      store_->setString(joinKey(id_), "0");
      store_->add("elastic/join-admitted", 1);  // withdrawn: no longer pending
      if (over) {
        throw ElasticExcluded(fmt::format(
            "elastic: rank id {} asked to join, but the job's training ended (finished, or stopped below "
            "--min-ranks) before another step boundary; there is nothing to rejoin",
            id_));
      }
      throw ElasticExcluded(fmt::format(
          "elastic: rank id {} asked to join but was not admitted within {} s (the members reached no step "
          "boundary in that time, or are gone); it stays out. HINT: the wait is twice distributed.timeout_s",
          id_, options_.decisionTimeout.count() / 1000));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

void ElasticRendezvous::finish() { store_->setString("elastic/finished", "1"); }

bool ElasticRendezvous::finished() { return finished(*store_); }

bool ElasticRendezvous::finished(Store& store) { return store.check({"elastic/finished"}); }

}  // namespace ddp
