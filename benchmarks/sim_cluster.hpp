// SimCluster: a cluster on this machine that behaves like a network, for
// measuring the cross-host path without one.
//
// H "hosts" are network namespaces, each with one address on a link to a
// switch (a bridge in a namespace of its own). Every link is a veth pair
// shaped by tc netem in both directions: a rate and half the one-way
// latency on each side, so a packet from host to host meets the rate twice
// (its link up, the peer's down) and the whole latency once. Ranks on one
// host share its namespace, so they still find each other through shared
// memory; between hosts, traffic only ever crosses those links.
//
// Contract
// - Needs root, ip and tc (iproute2), and a kernel that allows network
//   namespaces; unavailable() says why not, before anything is made.
// - A kernel without netem (sch_netem) gets tbf instead: the rate is
//   simulated, the latency is not, and note() says so.
// - Everything it makes carries "ddpsim<pid>" in its name. The destructor
//   kills what still runs in the namespaces and deletes them (the links
//   and the bridge go with them). Once one exists, SIGINT, SIGTERM and
//   SIGHUP end the run through that destructor (catchStopSignals; a second
//   one kills at once). A SimCluster of a process killed outright is
//   removed by the next one: each holds a flock on
//   /run/ddpsim/ddpsim<pid>.lock while it lives, and namespaces whose lock
//   is free are stale, whatever became of the pid.
// - wrap(host, argv) gives the argv that starts a program inside a host:
//   in its network namespace, with a host name of its own (a UTS
//   namespace named as the network one), so that nothing treats two
//   simulated hosts as one machine by their name. They still share this
//   kernel, its pids and /dev/shm.
// - The switch's namespace also has an address of its own on the bridge,
//   serviceAddress(): a service node (etcd for the store) that every host
//   reaches over its link, and that survives any host. wrapService(argv)
//   runs a program there.
// - Faults (ddp-bench faults): killHost(h) SIGKILLs every process inside
//   host h's namespace at once, as a host that loses power; setLink(h,
//   false) takes its interface down (no packet passes, no connection is
//   closed: a cut cable) and setLink(h, true) brings it back, shaped as
//   before. reshape(h, profile) gives host h's link another rate and
//   latency, both directions, while it carries traffic (a host moved to a
//   slower link: a straggler across hosts).
#pragma once

#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace ddp::bench {

// A link: rate and one-way host-to-host latency; none: an unshaped veth.
struct LinkProfile {
  std::string name;
  double gbitPerSecond = 0;  // 0: not shaped
  double latencyUs = 0;
  std::string describe() const;  // "1 Gbit/s, 200 us one way"
};
// "10gbit" (10 Gbit/s, 50 us), "1gbit" (1 Gbit/s, 200 us), "10mbit" (10
// Mbit/s, 200 us), "none"; throws
// BenchError naming the known ones otherwise.
LinkProfile linkProfile(const std::string& name);

// "2x2" -> {2 hosts, 2 ranks per host}; throws BenchError otherwise.
struct HostLayout {
  int hosts = 1;
  int ranksPerHost = 1;
  int worldSize() const { return hosts * ranksPerHost; }
  int hostOf(int rank) const { return rank / ranksPerHost; }
};
HostLayout parseHostLayout(const std::string& text);

class SimCluster {
 public:
  // Why a SimCluster cannot be made here, or nullopt when it can.
  static std::optional<std::string> unavailable();

  SimCluster(int hosts, LinkProfile link);
  ~SimCluster();
  SimCluster(const SimCluster&) = delete;
  SimCluster& operator=(const SimCluster&) = delete;

  int hosts() const { return static_cast<int>(namespaces_.size()); }
  const std::string& address(int host) const { return addresses_.at(host); }
  const std::string& netns(int host) const { return namespaces_.at(host); }
  const LinkProfile& link() const { return link_; }
  // What the links do not simulate here (no netem: rate only), or "".
  const std::string& note() const { return note_; }
  // `argv` run inside `host`: {"ip", "netns", "exec", NS, "unshare", "--uts", ..., argv...}.
  std::vector<std::string> wrap(int host, const std::vector<std::string>& argv) const;
  const std::string& serviceAddress() const { return serviceAddress_; }
  std::vector<std::string> wrapService(const std::vector<std::string>& argv) const;
  // SIGKILL to every process of `host`'s namespace; returns how many.
  int killHost(int host) const;
  void setLink(int host, bool up) const;
  void reshape(int host, const LinkProfile& profile) const;

 private:
  void teardown();
  LinkProfile link_;
  std::string note_;
  std::string prefix_;  // "ddpsim<pid>"
  int lockFd_ = -1;     // flock on /run/ddpsim/<prefix>.lock: this cluster is alive
  std::string switchNs_;
  std::string serviceAddress_;
  std::vector<std::string> namespaces_, addresses_;
};

// For a subcommand's --hosts and --link: parses both into `layout` and
// makes the cluster, printing a "# simulated cluster: ..." header (and its
// note) to `out`. Returns null, having printed "SKIPPED: ...", where it
// cannot run here; throws BenchError for bad values.
std::unique_ptr<SimCluster> clusterFromOptions(const std::string& hosts, const std::string& link, HostLayout& layout,
                                               std::ostream& out);

}  // namespace ddp::bench
