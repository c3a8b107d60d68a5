#include "benchmarks/sim_cluster.hpp"

#include <fmt/format.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cctype>
#include <cstring>
#include <sstream>

#include "benchmarks/bench_util.hpp"
#include "framework/launch/spawn.hpp"

namespace ddp::bench {
namespace {

constexpr const char* kPrefix = "ddpsim";

std::string findTool(const char* name) {
  for (const char* dir : {"/usr/sbin/", "/sbin/", "/usr/bin/", "/bin/"}) {
    const std::string path = std::string(dir) + name;
    if (::access(path.c_str(), X_OK) == 0) return path;
  }
  return "";
}

std::string trimmed(const std::string& text) {
  size_t end = text.find_last_not_of(" \n\r\t");
  return end == std::string::npos ? "" : text.substr(0, end + 1);
}

// Runs `argv` (argv[0]: "ip" or "tc") and returns its output; a failure is
// a BenchError quoting the command and what it printed.
std::string runTool(std::vector<std::string> argv, bool mustSucceed = true) {
  const std::string shown = fmt::format("{}", fmt::join(argv, " "));
  SpawnOptions options;
  options.program = findTool(argv[0].c_str());
  if (options.program.empty()) throw BenchError(fmt::format("simulated cluster: {} not found", argv[0]));
  options.argv = std::move(argv);
  const FinishedProcess done = runProcess(std::move(options));
  const bool ok = WIFEXITED(done.status) && WEXITSTATUS(done.status) == 0;
  if (!ok && mustSucceed) {
    throw BenchError(fmt::format("simulated cluster: `{}` failed: {}", shown, trimmed(done.output)));
  }
  return ok ? done.output : std::string();
}

std::vector<std::string> listNamespaces() {
  std::vector<std::string> names;
  std::istringstream lines(runTool({"ip", "netns", "list"}, /*mustSucceed=*/false));
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream words(line);
    std::string name;
    if (words >> name) names.push_back(name);
  }
  return names;
}

int killNamespace(const std::string& ns) {
  std::istringstream pids(runTool({"ip", "netns", "pids", ns}, /*mustSucceed=*/false));
  long pid = 0;
  int killed = 0;
  while (pids >> pid) killed += ::kill(static_cast<pid_t>(pid), SIGKILL) == 0;
  return killed;
}

void removeNamespace(const std::string& ns) {
  killNamespace(ns);
  runTool({"ip", "netns", "delete", ns}, /*mustSucceed=*/false);
}

// A SimCluster holds an exclusive flock on kLockDir/<prefix>.lock while it
// exists; the lock goes with its process, however that ends.
constexpr const char* kLockDir = "/run/ddpsim";

std::string lockPath(const std::string& prefix) { return std::string(kLockDir) + "/" + prefix + ".lock"; }

// Whether the SimCluster named `prefix` is gone: its lock file is missing or
// can be locked. (A pid alone could be another process's by now, or live in
// another pid namespace that shares /run/netns.)
bool isStale(const std::string& prefix) {
  const int fd = ::open(lockPath(prefix).c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return true;
  const bool free = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
  ::close(fd);
  return free;
}

// Namespaces of SimClusters whose process is gone (killed before its
// destructor ran).
void removeStale() {
  for (const std::string& ns : listNamespaces()) {
    if (ns.rfind(kPrefix, 0) != 0) continue;
    size_t i = std::string(kPrefix).size();
    while (i < ns.size() && std::isdigit(static_cast<unsigned char>(ns[i]))) ++i;
    const std::string prefix = ns.substr(0, i);
    if (isStale(prefix)) {
      removeNamespace(ns);
      ::unlink(lockPath(prefix).c_str());
    }
  }
}

// One side of a link: netem with half the one-way latency and the rate;
// where the kernel has no netem, tbf with the rate alone. Returns false in
// that case (the latency is not simulated).
bool shape(const std::string& ns, const std::string& dev, const LinkProfile& link, bool replace = false) {
  if (link.gbitPerSecond <= 0 && link.latencyUs <= 0) return true;
  const std::string verb = replace ? "replace" : "add";
  const std::string rate = fmt::format("{}mbit", static_cast<long long>(link.gbitPerSecond * 1000));
  // netem's default queue of 1000 packets: a deeper one only adds delay.
  std::vector<std::string> netem = {"tc", "-n", ns, "qdisc", verb, "dev", dev, "root", "netem"};
  if (link.latencyUs > 0) netem.insert(netem.end(), {"delay", fmt::format("{}us", link.latencyUs / 2)});
  if (link.gbitPerSecond > 0) netem.insert(netem.end(), {"rate", rate});
  try {
    runTool(netem);
    return true;
  } catch (const BenchError& e) {
    // Kernels say "Specified qdisc kind is unknown", older ones
    // "RTNETLINK answers: No such file or directory".
    const std::string why = e.what();
    if (why.find("qdisc kind is unknown") == std::string::npos &&
        why.find("No such file or directory") == std::string::npos) {
      throw;
    }
  }
  if (link.gbitPerSecond > 0) {
    // A bucket of 1 ms at the rate, and at least two 64 KiB segments (veth
    // passes TSO segments whole), queued for up to 50 ms.
    const long long burst = std::max<long long>(2 * 65536, static_cast<long long>(link.gbitPerSecond * 1e9 / 8 / 1000));
    runTool({"tc", "-n", ns, "qdisc", verb, "dev", dev, "root", "tbf", "rate", rate, "burst", std::to_string(burst),
             "latency", "50ms"});
  }
  return false;
}

}  // namespace

std::string LinkProfile::describe() const {
  if (gbitPerSecond <= 0 && latencyUs <= 0) return "unshaped veth links";
  if (gbitPerSecond > 0 && gbitPerSecond < 1) return fmt::format("{:g} Mbit/s, {} us one way", gbitPerSecond * 1000, latencyUs);
  return fmt::format("{} Gbit/s, {} us one way", gbitPerSecond, latencyUs);
}

LinkProfile linkProfile(const std::string& name) {
  if (name == "10gbit") return {name, 10, 50};
  if (name == "1gbit") return {name, 1, 200};
  if (name == "10mbit") return {name, 0.01, 200};
  if (name == "none") return {name, 0, 0};
  throw BenchError(fmt::format("--link {}: unknown profile (known: 10gbit = 10 Gbit/s and 50 us, 1gbit = 1 Gbit/s and "
                               "200 us, 10mbit = 10 Mbit/s and 200 us, none = unshaped)",
                               name));
}

HostLayout parseHostLayout(const std::string& text) {
  HostLayout layout;
  char x = 0, extra = 0;
  std::istringstream in(text);
  if (!(in >> layout.hosts >> x >> layout.ranksPerHost) || x != 'x' || (in >> extra) || layout.hosts < 1 ||
      layout.ranksPerHost < 1 || layout.hosts > 16 || layout.ranksPerHost > 64) {
    throw BenchError(fmt::format("--hosts {}: expected HOSTSxRANKS, e.g. 2x2 (1-16 hosts, 1-64 ranks each)", text));
  }
  return layout;
}

std::optional<std::string> SimCluster::unavailable() {
  if (::geteuid() != 0) return std::string("network namespaces need root (ip netns add)");
  if (findTool("ip").empty()) return std::string("ip not found (iproute2)");
  if (findTool("tc").empty()) return std::string("tc not found (iproute2)");
  if (findTool("unshare").empty()) return std::string("unshare not found (util-linux)");
  return std::nullopt;
}

SimCluster::SimCluster(int hosts, LinkProfile link) : link_(std::move(link)) {
  if (auto why = unavailable()) throw BenchError("simulated cluster: " + *why);
  catchStopSignals();  // Ctrl-C or a timeout ends the run through the destructor
  removeStale();
  const int pid = static_cast<int>(::getpid());
  prefix_ = fmt::format("{}{}", kPrefix, pid);
  ::mkdir(kLockDir, 0700);
  lockFd_ = ::open(lockPath(prefix_).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lockFd_ < 0 || ::flock(lockFd_, LOCK_EX | LOCK_NB) != 0) {
    throw BenchError(fmt::format("simulated cluster: cannot lock {}: {}", lockPath(prefix_), std::strerror(errno)));
  }
  const std::string subnet = fmt::format("10.231.{}", pid % 250 + 1);
  try {
    switchNs_ = prefix_ + "sw";
    runTool({"ip", "netns", "add", switchNs_});
    runTool({"ip", "-n", switchNs_, "link", "add", "br0", "type", "bridge"});
    runTool({"ip", "-n", switchNs_, "link", "set", "br0", "up"});
    runTool({"ip", "-n", switchNs_, "link", "set", "lo", "up"});
    serviceAddress_ = subnet + ".254";
    runTool({"ip", "-n", switchNs_, "addr", "add", serviceAddress_ + "/24", "dev", "br0"});
    for (int h = 0; h < hosts; ++h) {
      if (stopSignal()) throw BenchError(fmt::format("stopped by signal {} while making the cluster", stopSignal()));
      const std::string ns = fmt::format("{}h{}", prefix_, h);
      const std::string port = fmt::format("port{}", h);
      runTool({"ip", "netns", "add", ns});
      namespaces_.push_back(ns);
      addresses_.push_back(fmt::format("{}.{}", subnet, h + 1));
      runTool({"ip", "link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", port, "netns", switchNs_});
      runTool({"ip", "-n", ns, "addr", "add", addresses_.back() + "/24", "dev", "eth0"});
      runTool({"ip", "-n", ns, "link", "set", "lo", "up"});
      runTool({"ip", "-n", ns, "link", "set", "eth0", "up"});
      runTool({"ip", "-n", switchNs_, "link", "set", port, "master", "br0"});
      runTool({"ip", "-n", switchNs_, "link", "set", port, "up"});
      const bool exact = shape(ns, "eth0", link_) & shape(switchNs_, port, link_);
      if (!exact && link_.latencyUs > 0) {
        note_ = fmt::format("this kernel has no netem (sch_netem): links are held to {} Gbit/s by tbf, without the "
                            "{} us of latency",
                            link_.gbitPerSecond, link_.latencyUs);
      }
    }
  } catch (...) {
    teardown();
    throw;
  }
}

SimCluster::~SimCluster() { teardown(); }

void SimCluster::teardown() {
  for (const std::string& ns : namespaces_) removeNamespace(ns);
  if (!switchNs_.empty()) removeNamespace(switchNs_);
  namespaces_.clear();
  addresses_.clear();
  switchNs_.clear();
  serviceAddress_.clear();
  if (lockFd_ >= 0) {
    ::unlink(lockPath(prefix_).c_str());
    ::close(lockFd_);
    lockFd_ = -1;
  }
}

std::unique_ptr<SimCluster> clusterFromOptions(const std::string& hosts, const std::string& link, HostLayout& layout,
                                               std::ostream& out) {
  layout = parseHostLayout(hosts);
  const LinkProfile profile = linkProfile(link);
  if (layout.worldSize() < 2) throw BenchError(fmt::format("--hosts {}: a cluster needs at least 2 ranks", hosts));
  if (auto why = SimCluster::unavailable()) {
    out << "SKIPPED: --hosts " << hosts << ": " << *why << "\n";
    return nullptr;
  }
  auto cluster = std::make_unique<SimCluster>(layout.hosts, profile);
  out << fmt::format("# simulated cluster: {} hosts x {} ranks ({} .. {}), {}\n", layout.hosts, layout.ranksPerHost,
                     cluster->address(0), cluster->address(layout.hosts - 1), profile.describe());
  if (!cluster->note().empty()) out << "# note: " << cluster->note() << "\n";
  return cluster;
}

std::vector<std::string> SimCluster::wrap(int host, const std::vector<std::string>& argv) const {
  // A host name of its own (a UTS namespace): what a process decides by
  // host name (shared memory with a peer, whether a peer's pid is one it
  // can watch) it decides as on separate machines. (Where neither
  // sethostname nor /proc/sys may be written, the name stays the machine's;
  // ddp-bench faults then sees its survivors decide by death, not by the
  // heartbeat, and its test says so.)
  std::vector<std::string> out = {findTool("ip"), "netns", "exec", netns(host), findTool("unshare"), "--uts", "--",
                                  "/bin/sh", "-c",
                                  "{ hostname \"$0\" || echo \"$0\" > /proc/sys/kernel/hostname; } 2>/dev/null; "
                                  "exec \"$@\"",
                                  netns(host)};
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

std::vector<std::string> SimCluster::wrapService(const std::vector<std::string>& argv) const {
  std::vector<std::string> out = {findTool("ip"), "netns", "exec", switchNs_};
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

int SimCluster::killHost(int host) const { return killNamespace(netns(host)); }

void SimCluster::reshape(int host, const LinkProfile& profile) const {
  if (profile.gbitPerSecond <= 0 && profile.latencyUs <= 0) {
    runTool({"tc", "-n", netns(host), "qdisc", "del", "dev", "eth0", "root"}, /*mustSucceed=*/false);
    runTool({"tc", "-n", switchNs_, "qdisc", "del", "dev", fmt::format("port{}", host), "root"}, /*mustSucceed=*/false);
    return;
  }
  shape(netns(host), "eth0", profile, /*replace=*/true);
  shape(switchNs_, fmt::format("port{}", host), profile, /*replace=*/true);
}

void SimCluster::setLink(int host, bool up) const {
  runTool({"ip", "-n", netns(host), "link", "set", "eth0", up ? "up" : "down"});
}

}  // namespace ddp::bench
