// ElasticRendezvous: who trains together after a rank dies or a new one
// joins, decided through the job's store, so that the surviving ranks carry
// on with their weights in memory instead of a restart from a checkpoint
// file (ddp-run --min-ranks; the trainer's recovery is in
// experiment/trainer_recovery.cpp).
//
// Protocol
// - Members have ids: the global rank each process was started as. A rank
//   that the launcher starts again after a death keeps the id it replaces.
//   A generation is one membership and one process group: generation 0 is
//   ids 0..N-1 in order over the store as it is; generation G > 0 builds its
//   group over the store prefix "elastic/g<G>/pg".
// - Leaving generation G (a collective failed, or the ranks agreed at a step
//   boundary that someone waits to join): every member that can, arrives
//   at G + 1 by writing "elastic/g<G+1>/id/<id>" (its progress: optimizer
//   steps done) and incrementing "elastic/g<G+1>/arrived". The first to
//   arrive (the counter's 1) coordinates G + 1.
// - The coordinator waits until every member of G has arrived or is marked
//   dead ("elastic/dead/<id>", written by the launcher when it reaps the
//   rank: a counter, compared with the count when that incarnation was
//   admitted; or, on the coordinator's host, seen exiting through
//   "elastic/where/<id>" = "HOST PID"), at most `settle`; a member that neither arrives nor dies in that
//   time (hung) is left out. Sooner, a member that neither arrives nor dies
//   and whose heartbeat has stood still for `silentAfter` is left out: each
//   member adds 1 to "elastic/alive/<id>" every `heartbeat` from a thread
//   of its own, so one busy in a long step keeps its place, while one whose
//   host is lost or cut off (it cannot reach the store either) or whose
//   process is stopped does not hold the others for the whole settle time.
//   A member that has not beaten yet (still starting) is waited for up to
//   `settle`; a watcher that was itself away (no look for 2 heartbeats)
//   starts watching afresh; a silent member that arrives before the
//   decision is written is in. It then admits every id waiting to join
//   ("elastic/join/<id>" = its request number, set to 0 as it is admitted), and writes
//   "elastic/g<G+1>/members": the ids of G's members that go on, in G's
//   order, then the joiners in increasing order (a member's rank in G + 1
//   is its position: rank 0, the run folder's writer, stays with its
//   holder while it lives; a joiner never takes it over), the id whose state every member takes (the
//   arrived one with the most steps, the smallest id among equals), and
//   whether the generation is below the minimum (then every member stops:
//   the one with the state saves a checkpoint). Only the coordinator
//   writes it, once; "elastic/generation" then names G + 1.
// - Everyone else waits for that key. A member that finds itself left out
//   (it arrived after the decision) gets ElasticExcluded: its process ends
//   with kExitExcluded, and the launcher may start it again as a joiner.
// - Nothing of generation G is used in G + 1: its group is aborted and
//   dropped, so a message of the old generation (a frame from a hung peer)
//   reaches connections nobody reads, and a collective of G that a late
//   rank still runs fails, which sends it to the rendezvous, where it is
//   excluded. Keys of different generations never collide.
// - Before G + 1's group forms, each member sets "elastic/g<G+1>/ready/<id>"
//   and waits for the others' (awaitMembers): a member marked dead, or
//   silent for `silentAfter`, meanwhile sends the rest on at once. A
//   failure during a rendezvous or while the new group forms (another
//   death) sends the members of G + 1 to G + 2, with G + 1's membership.
// - Joining: a process started with DDP_ELASTIC_JOIN=1 takes a request
//   number R ("elastic/join-seq"), sets "elastic/join/<id>" = R and
//   increments "elastic/join-requests"; the ranks
//   in training compare it with "elastic/join-admitted" (rank 0, throttled) and agree at a step
//   boundary to move to the next generation; the coordinator admits the
//   joiner (it first claims "elastic/join-claim/<R>" by an add: the first
//   claim wins), which learns its generation from "elastic/admitted/<id>".
//   A joiner that gives up claims the same key; if it wins, its request is
//   withdrawn (counted in "elastic/join-admitted", so nothing stays
//   pending), else it was admitted after all and takes that decision.
//   A joiner only ever acts on a generation it was admitted to: one that
//   is not admitted (the job finished its training first: the members set
//   "elastic/finished" once they are past their last step boundary; or no
//   boundary within the decision timeout) gets ElasticExcluded with the
//   reason, never a membership of its own making. Only after admission to
//   G may a joiner move on to G + 1 like any member.
// - Ids and processes: the membership names, per member, the join request
//   that admitted it (0 for the first world). A process is a member only
//   under its own request, so one left out but alive (frozen, cut off)
//   never takes the place of a replacement admitted under its id; a join
//   request under the id of a member that arrived is refused
//   ("elastic/admitted/<id>" = "refused": ElasticExcluded, with the reason),
//   and a launcher does not mark a rank dead that ended left out.
//
// Checked against a simulation of random deaths, hangs and joins with
// threads over one in-memory store (tests/test_elastic.cpp): every
// generation's members agree on the membership, every member of a
// generation is alive, and nobody is in two memberships of one generation.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "framework/store/store.hpp"

namespace ddp {

// A process left out of the job's new membership exits with this.
constexpr int kExitExcluded = 75;
// The job went below --min-ranks: the survivors saved a checkpoint and exit with this.
constexpr int kExitBelowMinRanks = 4;
// Collectives kept timing out with every rank alive (ElasticStalled): a
// checkpoint was saved, every rank exits with this; none restarts.
constexpr int kExitStalled = 5;
// Left out because its host's link was found too slow (ElasticSlowHost):
// the launcher does not start it again into the same link.
constexpr int kExitSlowHost = 76;

class ElasticExcluded : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Left out because its host's link is the slow one (a collective timed out
// with every rank alive, and the probe of the links found it).
class ElasticSlowHost : public ElasticExcluded {
 public:
  using ElasticExcluded::ElasticExcluded;
};

// The membership fell below the minimum: the job stops (after the member
// with the state saved a checkpoint).
class ElasticBelowMinimum : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Collectives keep timing out with every member alive, at one step, and no
// host's link stands out to be left out: the job stops (no livelock).
class ElasticStalled : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct ElasticMembership {
  int64_t generation = 0;
  std::vector<int> ids;  // G's members in G's order, then joiners; a member's rank is its position
  // Per member: its id's death count when it was admitted; a higher count
  // in "elastic/dead/<id>" means this incarnation is dead.
  std::vector<int64_t> incarnations;
  // Per member: the join request that admitted it (0: a member from the
  // start). A process left out but alive (frozen, cut off) and the
  // replacement admitted under its id are told apart by it.
  std::vector<int64_t> requests;
  int sourceId = 0;      // whose state every member takes
  int64_t sourceSteps = 0;
  bool belowMinimum = false;
  // Every member of the generation before arrived, none joined, and one at
  // least came because a collective timed out: nobody is gone, someone is
  // slow. The members probe the links between hosts before anything else
  // (the trainer's recovery), all of them, as all read this decision.
  bool probeLinks = false;
  // With probeLinks: how many generations in a row have probed at this
  // sourceSteps (1 for the first); the trainer stops at 3.
  int timeoutsAtStep = 0;
  int rankOf(int id) const;  // -1 when id is not a member
  int world() const { return static_cast<int>(ids.size()); }
};

struct ElasticOptions {
  int minRanks = 1;
  int maxId = 0;  // ids are 0..maxId-1 (the job's first world size)
  // How long the coordinator waits for members that neither arrive nor die.
  std::chrono::milliseconds settle{10000};
  // How long a member waits for the coordinator's decision.
  std::chrono::milliseconds decisionTimeout{60000};
  // Each member's heartbeat period (0: none), and how long a heartbeat may
  // stand still before a member that neither arrived nor died is left out.
  std::chrono::milliseconds heartbeat{250};
  std::chrono::milliseconds silentAfter{1500};
};

class ElasticRendezvous {
 public:
  // A member (id >= 0) starts its heartbeat; it stops with the object.
  ElasticRendezvous(std::shared_ptr<Store> store, int id, ElasticOptions options);
  ~ElasticRendezvous();
  ElasticRendezvous(const ElasticRendezvous&) = delete;
  ElasticRendezvous& operator=(const ElasticRendezvous&) = delete;

  // Generation 0: ids 0..world-1.
  ElasticMembership initial(int world) const;
  // Leaves `current` for the next generation (see the protocol), reporting
  // `steps` done, and whether a collective's timeout sent it
  // ("elastic/g<G>/timedout/<id>", for probeLinks); returns it. Throws
  // ElasticExcluded when left out.
  ElasticMembership next(const ElasticMembership& current, int64_t steps, bool timedOut = false);
  // A joiner: asks to join, waits to be admitted (at most the decision
  // timeout) and returns the membership it was admitted to; throws
  // ElasticExcluded, its request withdrawn, when the job finished first or
  // the wait ran out.
  ElasticMembership join();
  // Rank 0, between steps: whether someone waits to join (a store
  // round trip; call it throttled).
  bool joinPending() { return joinsPending() > 0; }
  // How many ask to join and are not admitted yet (a store round trip).
  int64_t joinsPending();
  // Every member once training is over, or the job stops below the
  // minimum (no step boundary is left to admit a joiner at): a joiner that
  // still waits is told so and stays out, and a launcher does not start
  // another.
  void finish();
  bool finished();
  static bool finished(Store& store);

  // After the decision, before the group forms: every member says it is
  // ready and waits for the others, so that a member that died meanwhile
  // (marked dead) sends the rest to the next generation at once instead of
  // after the group's timeout. Throws std::runtime_error naming it.
  void awaitMembers(const ElasticMembership& membership);

  // The store a generation's group forms over.
  std::shared_ptr<Store> groupStore(int64_t generation) const;

  // The launcher: `id`'s process ended (it will not arrive).
  static void markDead(Store& store, int id);
  // Whether any of `ids` beats: its heartbeat moves within `window` (at
  // least a few heartbeats). A replacement launcher asks it of the other
  // nodes' ids, to tell a running job from a stale one in the store.
  static bool anyAlive(Store& store, const std::vector<int>& ids, std::chrono::milliseconds window);

  // While a long collective runs (a checkpoint's save, which allows the
  // slowest disk ten minutes): the first member of `membership` other than
  // this one whose heartbeat has stood still for `window` (at least
  // silentAfter) as this process has watched it (call it at most every
  // 750 ms: a longer look away restarts the count); nullopt while every
  // one beats. A slow disk does not stop a heartbeat; a frozen process or
  // a cut link does. A dead one's closed connections fail the collective.
  std::optional<int> lostMember(const ElasticMembership& membership, std::chrono::milliseconds window);
  // Whether the generation after `current`'s was decided without this
  // member (its id absent, or present for a replacement admitted under
  // it): the others went on without it, and what it does for `current`
  // (a checkpoint's index, say) is no longer the group's. A member left out
  // while frozen asks it when it wakes, before it renames a file into place.
  // (Not merely a next generation begun: members that wait for a joiner
  // arrive there while rank 0 still writes a background save's index.)
  bool superseded(const ElasticMembership& current);
  // "host H, pid P" of `id`, as it wrote it at start, or "where unknown".
  std::string whereOf(int id);

  int id() const { return id_; }
  // Whether this process is a member of `m`: its id is there, admitted by
  // this process's own join request (or by none, for both).
  bool isMember(const ElasticMembership& m) const;

 private:
  ElasticMembership decide(int64_t generation, const ElasticMembership& previous);
  ElasticMembership awaitDecision(int64_t generation);
  bool exiting(int id);  // its process is on this host and exiting
  // Whether `id`'s heartbeat has stood still for silentAfter, as this
  // process has watched it (see the protocol); never for a member that has
  // not beaten yet, nor while heartbeats are off.
  bool silent(int id) { return silentFor(id, options_.silentAfter); }
  bool silentFor(int id, std::chrono::milliseconds window);
  struct Observed {
    int64_t beat = -1;
    std::chrono::steady_clock::time_point changed, read;
  };
  std::map<int, Observed> observed_;
  std::shared_ptr<Store> store_;
  int id_;
  int64_t request_ = 0;  // the join request that admitted this process (0: none)
  ElasticOptions options_;
  struct Heartbeat;
  std::shared_ptr<Heartbeat> heartbeat_;  // shared with its thread, which may outlive this object
};

}  // namespace ddp
