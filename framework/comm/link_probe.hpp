// Host links: which host's network link holds a job back, measured, not
// guessed (the straggler report, and the recovery after a collective timed
// out with every member alive: experiment/trainer_recovery.cpp).
//
// A slow link slows every rank's collectives alike (a ring waits for its
// slowest edge), so the ranks' own waits cannot tell whose link it is. The
// probe measures the links themselves: the ranks are grouped by host name,
// and the first rank of each host (its leader) sends `bytes` to the next
// host's leader, in a ring of hosts, and times until that one's small
// acknowledgement comes back; all edges at once. A host whose link is slow
// makes both of its edges slow (its way in and its way out), so with 3
// hosts or more the host is told apart from its neighbours; with 2 the one
// link between them is all there is to see.
//
// Contract
// - hostNames() and probeHostLinks() are collectives: every rank of the
//   group calls them, in the same order among its other collectives.
// - probeHostLinks() runs a barrier (the leaders start together), sends
//   only between leaders (point-to-point, tags kProbeTag and kProbeTag +
//   1), then one small allreduce that gives every rank the same figures, so
//   every rank reaches the same verdict.
// - A group on one host (or of one rank) probes nothing: edgeSeconds is
//   empty. So does an NCCL group, whose point-to-point has no tags.
// - A failure is the group's error (a timeout names the rank waited for),
//   or, as a backstop 5 s past the timeout, one naming the rank that did
//   not send or acknowledge.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "framework/comm/process_group.hpp"

namespace ddp {

struct HostLinks {
  std::vector<std::string> hostOfRank;  // by rank
  std::vector<std::string> hosts;       // distinct, in the order of their first rank
  std::vector<int> leaders;             // each host's first rank
  // edgeSeconds[h]: hosts[h] -> hosts[(h + 1) % H]: `bytes` sent, and the acknowledgement back.
  std::vector<double> edgeSeconds;
  int64_t bytes = 0;

  // hostOfRank grouped: hosts and leaders filled, no edge measured yet.
  static HostLinks grouped(std::vector<std::string> hostOfRank, int64_t bytes);

  int hostCount() const { return static_cast<int>(hosts.size()); }
  // The ranks of hosts[h].
  std::vector<int> ranksOf(int h) const;
  // What edge e moved, in Mbit/s (payload over its time).
  double mbitPerSecond(int e) const;
  // The host both of whose edges took `factor` times the fastest edge's
  // time and `minExtraSeconds` more, when exactly one host is so; -1 when
  // none (or fewer than 3 hosts: two hosts share their only link). (10 ms:
  // a leader descheduled on a busy machine delays both edges of its host
  // too, by a scheduler's slice; 256 KiB cross a 100 Mbit/s link in 21 ms.)
  int slowHost(double factor = 4, double minExtraSeconds = 0.010) const;
  // "host h2 (ranks 2,3): its links moved 64 KiB at 9.8 and 9.6 Mbit/s, 61x slower than the fastest (h0 -> h1, 601 Mbit/s)"
  std::string describeSlow(int h) const;
};

constexpr int kProbeTag = 0x6c6b;  // "lk"

// Every rank's host name (gethostname), gathered: one allgather.
std::vector<std::string> hostNames(ProcessGroup& group);

// Times each edge of the ring of hosts (see above), after a barrier, the
// fastest of `rounds`. `hostOfRank` from hostNames(). `timeout` bounds
// every operation (0: the group's).
HostLinks probeHostLinks(ProcessGroup& group, const std::vector<std::string>& hostOfRank, int64_t bytes,
                         Milliseconds timeout = kUseGroupTimeout, int rounds = 1);

}  // namespace ddp
