// Elastic training (issue 30): the membership protocol against a simulation
// of random deaths, hangs and joins; the sampler's re-sharding; and ddp-run
// --min-ranks end to end: a rank killed mid-epoch, two, one during the
// recovery, a hung one, a rejoin, and a job that falls below the minimum.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <algorithm>
#include <set>
#include <sstream>
#include <thread>

#include "framework/core/errors.hpp"
#include "framework/experiment/run_folder.hpp"
#include "framework/launch/elastic.hpp"
#include "framework/parallel/sampler.hpp"
#include "framework/store/hash_store.hpp"
#include "tests/test_support.hpp"

using namespace ddp;
using ddp::test::metricsEpochs;
using ddp::test::readFile;
using ddp::test::runDdpRun;
using ddp::test::tempDir;

namespace {

std::vector<nlohmann::json> records(const std::string& path) { return ddp::test::jsonLines(path); }

std::string wineRun(const std::string& dir, const std::string& flags, const std::string& sets = "") {
  return "--nproc-per-node 4 " + flags + " " + std::string(DDP_SOURCE_DIR) + "/experiments/wine_baseline.json --out " +
         dir + " --set training.epochs=12 --set training.eval_every=1 --set training.log_every=1 --set training.save_every=0"
         " --set distributed.timeout_s=20 " + sets;
}

// A wine run (wineRun) that recovered in place: exit 0, its 12 epochs,
// every optimizer step once and in order, at `finalWorld` in the end.
// Returns its train.log.
std::string checkRecoveredInPlace(const ddp::test::ProgramOutcome& outcome, const std::string& dir, int finalWorld) {
  INFO(outcome.output);
  CHECK(outcome.exitCode == 0);
  CHECK(metricsEpochs(dir).size() == 12);
  const auto steps = records(dir + "/steps.jsonl");
  REQUIRE(!steps.empty());
  for (size_t i = 0; i < steps.size(); ++i) CHECK(steps[i]["step"] == int64_t(i + 1));
  CHECK(steps.back()["world_size"] == finalWorld);
  return readFile(dir + "/train.log");
}

// Three members (ids 0-2) of one job over an in-memory store, with a
// settle time of 2 s.
struct ThreeMembers {
  std::shared_ptr<HashStore> store;
  ElasticOptions options;
  ElasticRendezvous a, b, c;
  explicit ThreeMembers(int minRanks)
      : store(storeWithTimeout(std::chrono::milliseconds(20000))),
        options(settledOptions(minRanks)),
        a(store, 0, options),
        b(store, 1, options),
        c(store, 2, options) {}

  static std::shared_ptr<HashStore> storeWithTimeout(std::chrono::milliseconds timeout) {
    auto store = std::make_shared<HashStore>();
    store->setTimeout(timeout);
    return store;
  }
  static ElasticOptions settledOptions(int minRanks) {
    ElasticOptions options;
    options.minRanks = minRanks;
    options.maxId = 3;
    options.settle = std::chrono::milliseconds(2000);
    return options;
  }
};

}  // namespace

TEST_CASE("elastic rendezvous: a joiner acts only on a generation it was admitted to", "[elastic][solo]") {
  // Issue 40: a restarted rank that was never admitted (the job finished
  // first, or its wait ran out) once fell back to leaving generation 0 as
  // if it were a member, and was reported as arriving late at generation 1.
  auto store = std::make_shared<HashStore>();
  store->setTimeout(std::chrono::milliseconds(20000));
  ElasticOptions options;
  options.minRanks = 1;
  options.maxId = 3;
  options.settle = std::chrono::milliseconds(300);
  // Long enough for the other thread whatever the machine's load; the
  // section that waits it out sets a short one.
  options.decisionTimeout = std::chrono::milliseconds(30000);
  ElasticRendezvous member(store, 0, options);
  SECTION("the job finishes before any step boundary: told so at once") {
    std::thread finisher([&] {
      while (!member.joinPending()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      member.finish();
    });
    ElasticRendezvous joiner(store, 2, options);
    const auto start = std::chrono::steady_clock::now();
    CHECK_THROWS_WITH(joiner.join(), Catch::Contains("the job's training ended (finished, or stopped below --min-ranks) before another step boundary"));
    finisher.join();
    CHECK(std::chrono::steady_clock::now() - start < options.decisionTimeout);
    CHECK(ElasticRendezvous::finished(*store));
  }
  SECTION("no step boundary within the decision timeout: left out, with the reason") {
    ElasticOptions impatient = options;
    impatient.decisionTimeout = std::chrono::milliseconds(300);
    ElasticRendezvous joiner(store, 2, impatient);
    CHECK_THROWS_WITH(joiner.join(), Catch::Contains("was not admitted within"));
    // Its request is withdrawn: nothing is pending, and the members' next
    // generation does not admit a rank that is gone.
    CHECK_FALSE(member.joinPending());
    const ElasticMembership g1 = member.next(member.initial(1), 5);
    CHECK(g1.ids == std::vector<int>{0});
  }
  SECTION("admitted at the last boundary, then the job finishes: still a member") {
    ElasticRendezvous joiner(store, 1, options);
    ElasticMembership joined;
    std::thread t([&] { joined = joiner.join(); });
    while (!member.joinPending()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const ElasticMembership g1 = member.next(member.initial(1), 7);
    member.finish();
    t.join();
    CHECK(g1.ids == std::vector<int>{0, 1});
    CHECK(joined.generation == 1);
    CHECK(joined.ids == g1.ids);
  }
}

TEST_CASE("elastic rendezvous: random deaths, hangs and joins never split a generation", "[elastic][solo]") {
  const int seed = GENERATE(range(0, 40));
  INFO("seed " << seed);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  const int world = 2 + static_cast<int>(rng() % 5);  // 2..6
  auto store = std::make_shared<HashStore>();
  store->setTimeout(std::chrono::milliseconds(20000));
  ElasticOptions options;
  options.minRanks = 1;
  options.maxId = world;
  // Every arriving member must reach next() within this of the first.
  options.settle = std::chrono::milliseconds(2000);
  options.decisionTimeout = std::chrono::milliseconds(5000);
  // Per id, what it does in this round: arrive, die (marked dead at once),
  // or hang (neither; it arrives after the decision and must be left out).
  enum class Fate { Arrive, Die, Hang };
  std::vector<Fate> fate(world, Fate::Arrive);
  int survivors = world;
  for (int id = 0; id < world; ++id) {
    const uint32_t draw = rng() % 10;
    if (survivors > 1 && draw < 2) {
      fate[id] = Fate::Die;
      --survivors;
    } else if (survivors > 1 && draw < 3) {
      fate[id] = Fate::Hang;
      --survivors;
    }
  }
  const bool joiner = world > 2 && rng() % 2 == 0 && fate[0] == Fate::Die;  // id 0 comes back
  const int64_t steps = 10;
  std::vector<ElasticMembership> got(world);
  std::vector<std::string> outcome(world);
  std::vector<std::thread> threads;
  ElasticRendezvous launcherView(store, -1, options);
  for (int id = 0; id < world; ++id) {
    if (fate[id] == Fate::Die) ElasticRendezvous::markDead(*store, id);
  }
  std::thread joinThread;
  ElasticMembership joined;
  std::string joinOutcome;
  if (joiner) {
    // id 0 comes back and asks before the survivors leave generation 0:
    // it must be admitted into generation 1.
    joinThread = std::thread([&] {
      try {
        ElasticRendezvous r(store, 0, options);
        joined = r.join();
        joinOutcome = "member";
      } catch (const std::exception& e) {
        joinOutcome = std::string("error: ") + e.what();
      }
    });
    while (!launcherView.joinPending()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  for (int id = 0; id < world; ++id) {
    threads.emplace_back([&, id] {
      ElasticRendezvous r(store, id, options);
      const ElasticMembership first = r.initial(world);
      try {
        if (fate[id] == Fate::Die) return;
        // A hung member comes back after the decision (an event, not a
        // sleep that a loaded machine could outlast the settle time with).
        if (fate[id] == Fate::Hang) store->wait({"elastic/g1/members"});
        got[id] = r.next(first, steps + id % 2);
        outcome[id] = "member";
      } catch (const ElasticExcluded&) {
        outcome[id] = "excluded";
      } catch (const std::exception& e) {
        outcome[id] = std::string("error: ") + e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (joinThread.joinable()) joinThread.join();
  // The decision: one membership of generation 1, agreed by every member.
  const ElasticMembership* decided = nullptr;
  std::set<int> members;
  for (int id = 0; id < world; ++id) {
    INFO("id " << id << ": " << outcome[id]);
    if (fate[id] == Fate::Die) {
      CHECK(outcome[id].empty());
      continue;
    }
    if (fate[id] == Fate::Hang) {
      CHECK(outcome[id] == "excluded");  // arrived after the decision
      continue;
    }
    REQUIRE(outcome[id] == "member");
    if (!decided) decided = &got[id];
    CHECK(got[id].generation == 1);
    CHECK(got[id].ids == decided->ids);
    CHECK(got[id].sourceId == decided->sourceId);
    members.insert(id);
  }
  REQUIRE(decided != nullptr);
  // Exactly the ids that arrived in time (and the joiner), in order; every
  // member's rank is its position.
  std::set<int> expected = members;
  if (joiner) {
    expected.insert(0);
    CHECK(joinOutcome == "member");
    CHECK(joined.ids == decided->ids);
    CHECK(joined.generation == 1);
  }
  CHECK(std::set<int>(decided->ids.begin(), decided->ids.end()) == expected);
  // The members in generation 0's order (0..N-1), the joiner (id 0, whose
  // first incarnation died) after them: rank 0 stays with a member.
  std::vector<int> inOrder(members.begin(), members.end());
  if (joiner) inOrder.push_back(0);
  CHECK(decided->ids == inOrder);
  // The state comes from a member with the most steps (odd ids reported one more).
  CHECK(members.count(decided->sourceId) == 1);
  for (int id : members) CHECK(steps + id % 2 <= decided->sourceSteps);
  CHECK(decided->belowMinimum == false);
}

TEST_CASE("elastic rendezvous: several generations in a row with a joiner each time, below the minimum stops",
          "[elastic][solo]") {
  ThreeMembers members(2);
  // (References, not a structured binding: lambdas below capture them.)
  auto& store = members.store;
  const ElasticOptions& options = members.options;
  auto &a = members.a, &b = members.b;
  ElasticMembership m = a.initial(3);
  // Generation 1: id 2 dies.
  ElasticRendezvous::markDead(*store, 2);
  ElasticMembership ma, mb;
  std::thread tb([&] { mb = b.next(m, 5); });
  ma = a.next(m, 4);
  tb.join();
  CHECK(ma.ids == std::vector<int>{0, 1});
  CHECK(mb.ids == ma.ids);
  CHECK(ma.sourceId == 1);  // the most steps
  // Generation 2: id 2 rejoins; the members see it pending and move on.
  ElasticRendezvous c2(store, 2, options);
  ElasticMembership mc;
  std::thread tc([&] { mc = c2.join(); });
  while (!a.joinPending()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const ElasticMembership previous = ma;
  std::thread tb2([&] { mb = b.next(previous, 6); });
  ma = a.next(previous, 6);
  tb2.join();
  tc.join();
  CHECK(ma.generation == 2);
  CHECK(ma.ids == std::vector<int>{0, 1, 2});
  CHECK(mc.ids == ma.ids);
  CHECK(ma.sourceId == 0);  // equal steps: the smallest id
  CHECK_FALSE(a.joinPending());
  // Generation 3: ids 1 and 2 die; one left is below the minimum of 2.
  ElasticRendezvous::markDead(*store, 1);
  ElasticRendezvous::markDead(*store, 2);
  ma = a.next(ma, 7);
  CHECK(ma.ids == std::vector<int>{0});
  CHECK(ma.belowMinimum);
}

TEST_CASE("elastic rendezvous: a member left out learns it is superseded, the others do not", "[elastic][solo]") {
  ThreeMembers members(1);
  auto& store = members.store;
  auto &a = members.a, &b = members.b, &c = members.c;
  const ElasticMembership m = a.initial(3);
  CHECK_FALSE(a.superseded(m));
  // Id 0 is frozen (it never arrives); 1 and 2 arrive, and id 0 is marked
  // dead: generation 1 is decided without it.
  ElasticRendezvous::markDead(*store, 0);
  ElasticMembership mb, mc;
  std::thread tc([&] { mc = c.next(m, 5); });
  mb = b.next(m, 5);
  tc.join();
  REQUIRE(mb.ids == std::vector<int>{1, 2});
  CHECK(a.superseded(m));
  CHECK_FALSE(b.superseded(m));
  CHECK_FALSE(b.superseded(mb));  // generation 2 not decided yet
}

TEST_CASE("elastic rendezvous: a replacement admitted under a silent member's id: the old process is left out",
          "[elastic][solo]") {
  // Id 0 stops (frozen, or its host cut off) without dying, and a
  // replacement node asks to join under id 0 before generation 1 is
  // decided: generation 1 holds id 0 again, the replacement's. The old
  // process, woken, must not take that place: it is superseded, and its
  // arrival is refused, naming the replacement.
  ThreeMembers members(1);
  auto& store = members.store;
  auto &a = members.a, &b = members.b, &c = members.c;
  const ElasticMembership m = a.initial(3);
  ElasticRendezvous replacement(store, 0, members.options);
  ElasticMembership mr, mb, mc;
  std::thread tr([&] { mr = replacement.join(); });
  while (!b.joinPending()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::thread tc([&] { mc = c.next(m, 5); });
  mb = b.next(m, 5);  // id 0 neither arrives nor dies: left out after the settle time
  tc.join();
  tr.join();
  REQUIRE(mb.ids == std::vector<int>{1, 2, 0});
  CHECK(mr.ids == mb.ids);
  CHECK(replacement.isMember(mb));
  CHECK_FALSE(a.isMember(mb));
  CHECK(a.superseded(m));
  CHECK_FALSE(b.superseded(m));
  CHECK_THROWS_WITH(a.next(m, 5), Catch::Contains("id 0 there is a replacement admitted meanwhile"));
  // Its launcher starts it again as a joiner under id 0: refused at the
  // members' next generation, which keeps the replacement.
  ElasticRendezvous restarted(store, 0, members.options);
  std::string refusal;
  std::thread tj([&] {
    try {
      restarted.join();
    } catch (const ElasticExcluded& e) {
      refusal = e.what();
    }
  });
  while (!b.joinPending()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ElasticMembership m2b, m2c, m2r;
  tc = std::thread([&] { m2c = c.next(mb, 6); });
  tr = std::thread([&] { m2r = replacement.next(mb, 6); });
  m2b = b.next(mb, 6);
  tc.join();
  tr.join();
  tj.join();
  CHECK(m2b.ids == std::vector<int>{1, 2, 0});
  CHECK(m2r.ids == m2b.ids);
  CHECK(m2c.ids == m2b.ids);
  CHECK_THAT(refusal, Catch::Contains("another process holds that id"));
  CHECK_FALSE(b.joinPending());
}

TEST_CASE("elastic rendezvous: rank 0 stays with a member, never with a joiner (a replaced node 0)", "[elastic][solo]") {
  ThreeMembers members(1);
  auto& store = members.store;
  const ElasticOptions& options = members.options;
  auto &a = members.a, &b = members.b, &c = members.c;
  ElasticMembership m = a.initial(3);
  // Generation 1: id 0 (rank 0, the writer) dies; id 1 becomes rank 0.
  ElasticRendezvous::markDead(*store, 0);
  ElasticMembership mb, mc;
  std::thread tc([&] { mc = c.next(m, 5); });
  mb = b.next(m, 5);
  tc.join();
  CHECK(mb.ids == std::vector<int>{1, 2});
  CHECK(mc.ids == mb.ids);
  // Generation 2: id 0 comes back (a replacement node 0): it joins after
  // the members, so id 1 stays rank 0 and keeps writing.
  ElasticRendezvous a2(store, 0, options);
  ElasticMembership ma;
  std::thread ta([&] { ma = a2.join(); });
  while (!b.joinPending()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const ElasticMembership g1 = mb;
  tc = std::thread([&] { mc = c.next(g1, 6); });
  mb = b.next(g1, 6);
  tc.join();
  ta.join();
  CHECK(mb.ids == std::vector<int>{1, 2, 0});
  CHECK(ma.ids == mb.ids);
  // Generation 3: id 1 dies: rank 0 passes to id 2, the member before the joiner.
  ElasticRendezvous::markDead(*store, 1);
  ta = std::thread([&] { ma = a2.next(mb, 7); });
  mc = c.next(mb, 7);
  ta.join();
  CHECK(mc.ids == std::vector<int>{2, 0});
  CHECK(ma.ids == mc.ids);
}

TEST_CASE("elastic rendezvous: a member whose heartbeat stops is left out before the settle time, a slow one keeps "
          "its place",
          "[elastic][solo]") {
  auto store = std::make_shared<HashStore>();
  store->setTimeout(std::chrono::milliseconds(60000));
  ElasticOptions options;
  options.minRanks = 1;
  options.maxId = 3;
  options.settle = std::chrono::milliseconds(30000);  // far longer than the test
  options.heartbeat = std::chrono::milliseconds(50);
  options.silentAfter = std::chrono::milliseconds(1000);
  ElasticRendezvous a(store, 0, options), b(store, 1, options);
  auto c = std::make_unique<ElasticRendezvous>(store, 2, options);
  const ElasticMembership m = a.initial(3);
  // Generation 1: id 2 is busy (a long step) for 2.5 x silentAfter, its
  // heartbeat going: it is waited for and stays a member.
  ElasticMembership ma, mb, mc;
  std::thread tb([&] { mb = b.next(m, 5); });
  std::thread tc([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    mc = c->next(m, 5);
  });
  ma = a.next(m, 5);
  tb.join();
  tc.join();
  CHECK(ma.generation == 1);
  CHECK(ma.ids == std::vector<int>{0, 1, 2});
  CHECK(mb.ids == ma.ids);
  CHECK(mc.ids == ma.ids);
  // Generation 2: id 2's host is cut off: neither arrives nor is marked
  // dead, and its heartbeat stops. The others decide without it after
  // about silentAfter, not the 30 s settle time.
  c.reset();
  const ElasticMembership first = ma;
  const auto start = std::chrono::steady_clock::now();
  const ElasticMembership previous = ma;
  std::thread tb2([&] { mb = b.next(previous, 6); });
  ma = a.next(previous, 6);
  tb2.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(ma.generation == 2);
  CHECK(ma.ids == std::vector<int>{0, 1});
  CHECK(mb.ids == ma.ids);
  CHECK(seconds >= 0.9);  // its heartbeat was watched for silentAfter first
  CHECK(seconds < 15);
  // Its link back, it leaves generation 1 as the others did, and is told
  // that generation 2 was decided without it.
  ElasticRendezvous late(store, 2, options);
  CHECK_THROWS_AS(late.next(first, 6), ElasticExcluded);
}

TEST_CASE("elastic rendezvous: a member that never beat is waited for the settle time, and with heartbeats off no one "
          "is silent",
          "[elastic][solo]") {
  for (const bool off : {false, true}) {
    INFO("heartbeats " << (off ? "off" : "on"));
    auto store = std::make_shared<HashStore>();
    store->setTimeout(std::chrono::milliseconds(60000));
    ElasticOptions options;
    options.minRanks = 1;
    options.maxId = 3;
    options.settle = std::chrono::milliseconds(3000);
    options.heartbeat = std::chrono::milliseconds(off ? 0 : 50);
    options.silentAfter = std::chrono::milliseconds(500);
    // Id 2 never started its rendezvous (still loading, say): no beat at
    // all, so neither silent nor dead: the whole settle time, then out.
    ElasticRendezvous a(store, 0, options), b(store, 1, options);
    const ElasticMembership m = a.initial(3);
    ElasticMembership ma, mb;
    const auto start = std::chrono::steady_clock::now();
    std::thread tb([&] { mb = b.next(m, 1); });
    ma = a.next(m, 1);
    tb.join();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    CHECK(ma.ids == std::vector<int>{0, 1});
    CHECK(seconds >= 2.9);
  }
  // A heartbeat too short for its silence limit is refused.
  ElasticOptions bad;
  bad.heartbeat = std::chrono::milliseconds(500);
  bad.silentAfter = std::chrono::milliseconds(1000);
  CHECK_THROWS_AS(ElasticRendezvous(std::make_shared<HashStore>(), 0, bad), UsageError);
}

TEST_CASE("elastic rendezvous: every member learns to probe the links when all came back and one timed out",
          "[elastic]") {
  auto store = std::make_shared<HashStore>();
  store->setTimeout(std::chrono::milliseconds(20000));
  ElasticOptions options;
  options.minRanks = 1;
  options.maxId = 3;
  options.settle = std::chrono::milliseconds(2000);
  options.heartbeat = std::chrono::milliseconds(0);
  options.silentAfter = std::chrono::milliseconds(0);
  std::vector<std::unique_ptr<ElasticRendezvous>> r;
  for (int id = 0; id < 3; ++id) r.push_back(std::make_unique<ElasticRendezvous>(store, id, options));
  // All three arrive; `timedOut[id]` says which came by a timeout (the
  // others saw their connections closed). Every member reads one decision.
  auto round = [&](const ElasticMembership& m, const std::vector<bool>& timedOut, const std::vector<int>& ids) {
    std::vector<ElasticMembership> got(3);
    std::vector<std::thread> threads;
    for (int id : ids) {
      threads.emplace_back([&, id] { got[static_cast<size_t>(id)] = r[static_cast<size_t>(id)]->next(m, 7, timedOut[static_cast<size_t>(id)]); });
    }
    for (auto& t : threads) t.join();
    for (int id : ids) CHECK(got[static_cast<size_t>(id)].probeLinks == got[static_cast<size_t>(ids[0])].probeLinks);
    return got[static_cast<size_t>(ids[0])];
  };
  ElasticMembership m = r[0]->initial(3);
  m = round(m, {false, true, false}, {0, 1, 2});
  CHECK(m.ids == std::vector<int>{0, 1, 2});
  CHECK(m.probeLinks);
  CHECK(m.timeoutsAtStep == 1);
  // Again at the same step: counted, in the membership every member reads.
  m = round(m, {true, false, false}, {0, 1, 2});
  CHECK(m.probeLinks);
  CHECK(m.timeoutsAtStep == 2);
  // All came back, none timed out (an abort, a closed connection): no probe.
  m = round(m, {false, false, false}, {0, 1, 2});
  CHECK_FALSE(m.probeLinks);
  // One is gone: its loss explains the timeout; no probe.
  ElasticRendezvous::markDead(*store, 2);
  m = round(m, {true, true, false}, {0, 1});
  CHECK(m.ids == std::vector<int>{0, 1});
  CHECK_FALSE(m.probeLinks);
}

TEST_CASE("DistributedSampler: after a change of world mid-epoch every sample is read once", "[elastic][sampler]") {
  const int64_t n = GENERATE(0, 1, 7, 142, 1000);
  const int before = GENERATE(1, 3, 4);
  const int after = GENERATE(1, 2, 5);
  const int64_t consumed = GENERATE(0, 8, 64);
  INFO("n " << n << ", world " << before << " -> " << after << " after " << consumed);
  DistributedSampler first(n, 0, before, /*seed=*/3, true, false, /*pad=*/false);
  std::multiset<int64_t> read;
  // The first `consumed` positions, read at the old world size: each rank's
  // first indices (dealt position by position).
  for (int r = 0; r < before; ++r) {
    DistributedSampler s(n, r, before, 3, true, false, false);
    const auto mine = s.indicesForEpoch(2);
    for (size_t j = 0; j < mine.size(); ++j) {
      if (static_cast<int64_t>(r + j * before) < consumed) read.insert(mine[j]);
    }
  }
  for (int r = 0; r < after; ++r) {
    const auto rest = first.remainderForEpoch(2, consumed, r, after);
    CHECK(static_cast<int64_t>(rest.size()) == DistributedSampler::remainderSamplesFor(n, consumed, r, after));
    read.insert(rest.begin(), rest.end());
  }
  CHECK(static_cast<int64_t>(read.size()) == n);
  CHECK(std::set<int64_t>(read.begin(), read.end()).size() == read.size());  // none twice
}

// For strategies that cannot shadow a missing step (all but ddp), the rest
// of the epoch comes in equal shards: every unread position once, then
// repeats from the permutation's start (as the padded sampler pads); with
// dropLast, equal shards of floor(left / world) and no repeat.
TEST_CASE("DistributedSampler: the rest of an epoch in equal shards reads every unread sample", "[sampler]") {
  const int64_t n = GENERATE(1, 7, 142, 1000);
  const int after = GENERATE(1, 2, 3, 5);
  const int64_t consumed = GENERATE(0, 8, 64, 140);
  const bool dropLast = GENERATE(false, true);
  INFO("n " << n << ", world " << after << " after " << consumed << (dropLast ? ", drop_last" : ""));
  DistributedSampler sampler(n, 0, 2, /*seed=*/3, true, false, /*pad=*/true);
  const std::vector<int64_t> order = [&] {
    // The epoch's permutation: positions 0, 1, ... as rank 0 of world 1 reads them.
    DistributedSampler one(n, 0, 1, 3, true, false, true);
    return one.indicesForEpoch(2);
  }();
  const int64_t left = std::max<int64_t>(0, n - consumed);
  const int64_t each = dropLast ? left / after : (left + after - 1) / after;
  std::multiset<int64_t> read;
  for (int r = 0; r < after; ++r) {
    const auto rest = sampler.remainderForEpoch(2, consumed, r, after, /*equalShards=*/true, dropLast);
    CHECK(static_cast<int64_t>(rest.size()) == each);
    CHECK(DistributedSampler::remainderSamplesFor(n, consumed, r, after, true, dropLast) == each);
    read.insert(rest.begin(), rest.end());
  }
  std::multiset<int64_t> unread;
  for (int64_t p = consumed; p < n; ++p) unread.insert(order[static_cast<size_t>(p)]);
  if (dropLast) {
    // Positions consumed .. consumed + each * after - 1: each once.
    CHECK(static_cast<int64_t>(read.size()) == each * after);
    CHECK(std::includes(unread.begin(), unread.end(), read.begin(), read.end()));
  } else {
    // Every unread sample, and the padding from the permutation's start.
    CHECK(static_cast<int64_t>(read.size()) == each * after);
    CHECK(std::includes(read.begin(), read.end(), unread.begin(), unread.end()));
    std::multiset<int64_t> padding;
    for (int64_t p = std::max(n, consumed); p < consumed + each * after; ++p) padding.insert(order[static_cast<size_t>(p % n)]);
    std::multiset<int64_t> expected = unread;
    expected.insert(padding.begin(), padding.end());
    CHECK(read == expected);
  }
}

TEST_CASE("ddp-run --min-ranks: a rank killed mid-epoch, the others finish from memory, no step lost",
          "[elastic][launcher][solo]") {
  const std::string plain = tempDir() + "/plain", failed = tempDir() + "/failed";
  const auto reference = runDdpRun(wineRun(plain, "--min-ranks 2"));
  REQUIRE(reference.exitCode == 0);
  const auto outcome = runDdpRun(wineRun(failed, "--min-ranks 2"), "DDP_FAULT_INJECT=2@9");
  INFO(outcome.output);
  CHECK(outcome.exitCode == 0);
  CHECK(metricsEpochs(failed) == metricsEpochs(plain));
  const auto steps = records(failed + "/steps.jsonl"), referenceSteps = records(plain + "/steps.jsonl");
  // Every step once: 142 samples over 4 ranks then 3 are 2 steps an epoch either way.
  REQUIRE(steps.size() == referenceSteps.size());
  for (size_t i = 0; i < steps.size(); ++i) CHECK(steps[i]["step"] == int64_t(i + 1));
  CHECK(steps[8]["world_size"] == 4);
  CHECK(steps[9]["world_size"] == 3);
  CHECK(steps.back()["world_size"] == 3);
  const std::string log = readFile(failed + "/train.log");
  CHECK_THAT(log, Catch::Contains("elastic: generation 1: lost rank id(s) 2; world 4 -> 3"));
  // The same training within noise: the final test accuracy of 36 samples.
  const double a = records(failed + "/metrics.jsonl").back()["test_accuracy"];
  const double b = records(plain + "/metrics.jsonl").back()["test_accuracy"];
  CHECK(std::abs(a - b) <= 0.1);
}

TEST_CASE("ddp-run --min-ranks: two failures, and one during the recovery itself", "[elastic][launcher][solo]") {
  const std::string two = tempDir() + "/two", during = tempDir() + "/during";
  auto outcome = runDdpRun(wineRun(two, "--min-ranks 2"), "DDP_FAULT_INJECT=1@5,3@15");
  INFO(outcome.output);
  CHECK(outcome.exitCode == 0);
  auto steps = records(two + "/steps.jsonl");
  REQUIRE(!steps.empty());
  CHECK(steps.back()["world_size"] == 2);
  CHECK(steps.back()["step"] == int64_t(steps.size()));
  CHECK(metricsEpochs(two).size() == 12);
  // Rank 2 dies at step 7; rank 1 dies once generation 1 is decided, before
  // its group forms: the survivors go on to generation 2.
  outcome = runDdpRun(wineRun(during, "--min-ranks 2"), "DDP_FAULT_INJECT=2@7 DDP_FAULT_RECOVERY=1");
  INFO(outcome.output);
  CHECK(outcome.exitCode == 0);
  steps = records(during + "/steps.jsonl");
  REQUIRE(!steps.empty());
  CHECK(steps.back()["world_size"] == 2);
  CHECK(metricsEpochs(during).size() == 12);
  CHECK_THAT(readFile(during + "/train.log"), Catch::Contains("elastic: generation 2: lost rank id(s) 1,2; world 4 -> 2"));
  // Rank 1 dies once generation 1's group formed and took the state, before
  // DDP is built again: its buckets are allocated collectively (in shared
  // memory, through the store), which fails after the timeout (5 s) inside
  // the recovery's retry. The optimizer survives that, and generation 2
  // goes on without ranks 1 and 2.
  const std::string synced = tempDir() + "/synced";
  outcome = runDdpRun(wineRun(synced, "--min-ranks 2", "--set distributed.timeout_s=5"),
                      "DDP_FAULT_INJECT=2@7 DDP_FAULT_RECOVERY=1:synced");
  CHECK_THAT(checkRecoveredInPlace(outcome, synced, 2),
             Catch::Contains("elastic: generation 2: lost rank id(s) 1,2; world 4 -> 2"));
}

TEST_CASE("ddp-run --min-ranks: a rank frozen during a sharded save is left out after the timeout, not ten minutes",
          "[elastic][launcher][checkpoint][solo]") {
  // Rank 1 freezes (SIGSTOP: its heartbeat too, as behind a cut link)
  // among the callbacks at the end of epoch 3, just before the periodic
  // sharded save, and wakes 20 s later. The others wait for it in the
  // save's collectives, which allow a slow disk ten minutes; its heartbeat
  // standing still for distributed.timeout_s (5 s) ends that wait, and
  // they go on without it. Had they waited, it would have woken, joined
  // the save, and nobody would have been lost.
  const std::string run = tempDir() + "/frozen";
  const auto outcome = runDdpRun(wineRun(run, "--min-ranks 2",
                                         "--set training.save_every=1 --set training.checkpoint_format=sharded "
                                         "--set distributed.timeout_s=5"),
                                 "DDP_FAULT_INJECT=1#3:freeze=20000");
  CHECK_THAT(checkRecoveredInPlace(outcome, run, 3), Catch::Contains("lost rank id(s) 1; world 4 -> 3"));
  INFO(outcome.output);
  CHECK_THAT(outcome.output, Catch::Contains("checkpoint: rank id 1"));
  CHECK_THAT(outcome.output, Catch::Contains("stopped beating for 5 s"));
  // The saves after it, at world 3, are whole.
  CHECK(std::filesystem::exists(run + "/checkpoints/" + checkpointFileName(12, 0, true) + "/index.json"));
}

namespace {

// Rank 0, the run folder's writer, freezes among the callbacks at the end
// of epoch 3, before it wrote that epoch's records. Rank id 1 becomes the
// writer, and the epoch's records are there once: metrics.jsonl,
// metrics.csv and train.log hold each of the 12 epochs once, and the
// woken rank 0 (left out) wrote nothing into the run folder.
void checkWriterTakeOver(const std::string& run, const std::string& sets) {
  const auto outcome = runDdpRun(wineRun(run, "--min-ranks 2", sets + " --set distributed.timeout_s=5"),
                                 "DDP_FAULT_INJECT=0#3:freeze=20000");
  CHECK_THAT(checkRecoveredInPlace(outcome, run, 3), Catch::Contains("lost rank id(s) 0; world 4 -> 3"));
  const std::vector<int64_t> all{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  std::vector<int64_t> epochs;
  for (const auto& r : records(run + "/metrics.jsonl")) epochs.push_back(r["epoch"].get<int64_t>());
  CHECK(epochs == all);
  epochs.clear();
  std::ifstream csv(run + "/metrics.csv");
  std::string line;
  std::getline(csv, line);  // the header
  while (std::getline(csv, line)) epochs.push_back(std::stoll(line.substr(0, line.find(','))));
  CHECK(epochs == all);
  std::map<std::string, int> lines;
  const std::string log = readFile(run + "/train.log");
  std::istringstream in(log);
  while (std::getline(in, line)) {
    if (line.rfind("epoch ", 0) == 0) ++lines[line.substr(0, line.find(' ', 6))];
  }
  CHECK(lines.size() == 12);
  for (const auto& [head, count] : lines) CHECK(count == 1);
  CHECK(lines.count("epoch 3/12") == 1);
  CHECK_THAT(log, !Catch::Contains("run failed"));  // the left-out rank's own end is not the job's
}

}  // namespace

TEST_CASE("ddp-run --min-ranks: the writer frozen before a sharded save: another takes over, each epoch recorded once",
          "[elastic][launcher][checkpoint][solo]") {
  // The others pass the records (not theirs to write) and wait for it in
  // the save: the recovery comes among the epoch's callbacks.
  const std::string run = tempDir() + "/writer";
  checkWriterTakeOver(run, "--set training.save_every=1 --set training.checkpoint_format=sharded");
  CHECK(std::filesystem::exists(run + "/checkpoints/" + checkpointFileName(12, 0, true) + "/index.json"));
}

TEST_CASE("ddp-run --min-ranks: the writer frozen at an epoch's end, no save: the next writer records that epoch",
          "[elastic][launcher][solo]") {
  // No collective follows among the epoch's callbacks: the others go on
  // into epoch 4, and its first step's collective fails.
  checkWriterTakeOver(tempDir() + "/writer", "");
}

TEST_CASE("ddp-run --min-ranks: a hung rank is left out after the timeout, and a killed one rejoins", "[elastic][launcher][solo]") {
  const std::string hung = tempDir() + "/hung", rejoin = tempDir() + "/rejoin";
  // Rank 1 hangs after step 5 until the others have gone on without it (an
  // event: however slow the machine, it wakes after the decision). Their
  // collective times out after 5 s, and they wait 5 s more for it.
  auto outcome = runDdpRun(wineRun(hung, "--min-ranks 2", "--set distributed.timeout_s=5"),
                           "DDP_FAULT_INJECT=1@5:until-replaced");
  INFO(outcome.output);
  CHECK(outcome.exitCode == 0);
  CHECK(metricsEpochs(hung).size() == 12);
  CHECK_THAT(readFile(hung + "/train.log"), Catch::Contains("lost rank id(s) 1; world 4 -> 3"));
  CHECK_THAT(outcome.output, Catch::Contains("rank 1 (pid"));  // it woke, was left out, and exited (75)
  // Every member waits after step 10 until the restarted rank asks to join
  // (an event, however slowly it starts), so it finds the job running.
  outcome = runDdpRun(wineRun(rejoin, "--min-ranks 2 --max-restarts 1", "--set training.epochs=30"),
                      "DDP_FAULT_INJECT=2@7 DDP_FAULT_AWAIT_JOIN=10");
  INFO(outcome.output);
  CHECK(outcome.exitCode == 0);
  const auto steps = records(rejoin + "/steps.jsonl");
  REQUIRE(steps.size() == 60);
  CHECK(steps[6]["world_size"] == 4);
  CHECK(steps[7]["world_size"] == 3);
  CHECK(steps.back()["world_size"] == 4);  // it rejoined
  CHECK_THAT(readFile(rejoin + "/train.log"), Catch::Contains("rank id(s) 2 joined; world 3 -> 4"));
  // Killed after the next to last step: the job ends before it could come
  // back. Whichever comes first (it is not started again, it is told the
  // job finished, or it joins at the last boundary), every step runs once
  // and the job ends with 0, without waiting out a timeout.
  const std::string late = tempDir() + "/late";
  outcome = runDdpRun(wineRun(late, "--min-ranks 2 --max-restarts 1"), "DDP_FAULT_INJECT=2@23");
  INFO(outcome.output);
  CHECK(outcome.exitCode == 0);
  const auto lateSteps = records(late + "/steps.jsonl");
  REQUIRE(lateSteps.size() == 24);
  for (size_t i = 0; i < lateSteps.size(); ++i) CHECK(lateSteps[i]["step"] == int64_t(i + 1));
  CHECK_THAT(outcome.output, !Catch::Contains("after its membership was decided"));
  CHECK_THAT(outcome.output, !Catch::Contains("was not admitted within"));
}

TEST_CASE("ddp-run --min-ranks: below the minimum the job stops with a checkpoint that --resume continues",
          "[elastic][launcher][checkpoint][solo]") {
  const std::string dir = tempDir() + "/below";
  auto outcome = runDdpRun(wineRun(dir, "--min-ranks 4"), "DDP_FAULT_INJECT=3@9");
  INFO(outcome.output);
  CHECK(outcome.exitCode == kExitBelowMinRanks);
  CHECK_THAT(outcome.output, Catch::Contains("fewer than --min-ranks 4"));
  const auto checkpoints = listCheckpoints(dir);
  REQUIRE(!checkpoints.empty());
  CHECK(checkpoints.front().batch > 0);  // mid-epoch 5, after step 9
  outcome = runDdpRun(wineRun(dir, "--min-ranks 2 --resume"));
  INFO(outcome.output);
  CHECK(outcome.exitCode == 0);
  CHECK(metricsEpochs(dir).size() == 12);
  // Mistakes: a sharded strategy, a minimum above the world size.
  outcome = runDdpRun(wineRun(tempDir() + "/zero", "--min-ranks 2", "--set distributed.strategy=zero1"));
  CHECK(outcome.exitCode == 2);
  CHECK_THAT(outcome.output, Catch::Contains("--min-ranks: distributed.strategy zero1 cannot recover in place"));
  outcome = runDdpRun(wineRun(tempDir() + "/five", "--min-ranks 5"));
  CHECK(outcome.exitCode == 2);
  CHECK_THAT(outcome.output, Catch::Contains("--min-ranks 5 is more than the job's 4 ranks"));
}

TEST_CASE("ddp-run --min-ranks: a rank lost among the epoch-end callbacks (best checkpoints, early stopping)",
          "[elastic][launcher][solo]") {
  const std::string dir = tempDir() + "/callbacks";
  const auto outcome = runDdpRun(wineRun(dir, "--min-ranks 2",
                                         "--set training.keep_best=2 --set training.early_stopping.patience=50 "
                                         "--set training.save_every=3"),
                                 "DDP_FAULT_INJECT=1#4");
  CHECK_THAT(checkRecoveredInPlace(outcome, dir, 3), Catch::Contains("lost rank id(s) 1; world 4 -> 3"));
  CHECK(nlohmann::json::parse(readFile(dir + "/checkpoints/best/index.json"))["best"].size() == 2);
}

TEST_CASE("ddp-run --min-ranks on digits_cnn: a rank killed mid-epoch, the same accuracy within noise",
          "[elastic][launcher][solo]") {
  const std::string plain = tempDir() + "/plain", failed = tempDir() + "/failed";
  const std::string run = "--nproc-per-node 4 --min-ranks 2 " + std::string(DDP_SOURCE_DIR) +
                          "/experiments/digits_cnn.json --set training.epochs=6 --set training.eval_every=1 "
                          "--set training.log_every=1 --set training.save_every=0 --set distributed.timeout_s=20 --out ";
  const auto reference = runDdpRun(run + plain);
  REQUIRE(reference.exitCode == 0);
  const auto outcome = runDdpRun(run + failed, "DDP_FAULT_INJECT=1@20");
  INFO(outcome.output);
  CHECK(outcome.exitCode == 0);
  const auto steps = records(failed + "/steps.jsonl");
  CHECK(steps.back()["world_size"] == 3);
  for (size_t i = 0; i < steps.size(); ++i) CHECK(steps[i]["step"] == int64_t(i + 1));
  const double a = records(failed + "/metrics.jsonl").back()["test_accuracy"];
  const double b = records(plain + "/metrics.jsonl").back()["test_accuracy"];
  CHECK(std::abs(a - b) <= 0.05);
}
