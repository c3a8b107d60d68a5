#include "framework/launch/launcher.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <deque>
#include <iostream>
#include <thread>

#include "framework/core/errors.hpp"
#include "framework/core/log.hpp"
#include "framework/core/shm_names.hpp"
#include "framework/core/system.hpp"
#include "framework/launch/arrival.hpp"
#include "framework/launch/elastic.hpp"
#include "framework/launch/rank_env.hpp"
#include "framework/launch/spawn.hpp"
#include "framework/launch/stop_signals.hpp"
#include "framework/store/etcd_store.hpp"
#include "framework/store/tcp_store.hpp"

namespace ddp {
namespace {

using Clock = std::chrono::steady_clock;

struct RankProcess {
  int rank = 0;
  pid_t pid = -1;
  int outputFd = -1;
  int logFd = -1;          // --log-dir's file, or -1
  bool toConsole = true;   // --local-ranks-filter, --log-dir without --tee
  bool prefixed = false;   // "[rank r] " before each console line
  std::string partialLine;
  std::deque<std::string> lastLines;
  bool exited = false;
  int status = 0;
};

// Binds a TCP socket to host:port; returns the bound port, or -errno. With
// `listening`, the socket listens and stays open there (close-on-exec);
// otherwise it is closed again.
int tryBind(const std::string& host, int port, int* listening = nullptr) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (getaddrinfo(host.c_str(), service.c_str(), &hints, &found) != 0 || !found) {
    fail<UsageError>("ddp-run: cannot resolve master address '{}'. HINT: check --master-addr / MASTER_ADDR", host);
  }
  int result = -EADDRNOTAVAIL;
  for (addrinfo* ai = found; ai; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && (listening == nullptr || ::listen(fd, SOMAXCONN) == 0)) {
      sockaddr_storage bound{};
      socklen_t len = sizeof(bound);
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
      char serv[16] = {0};
      getnameinfo(reinterpret_cast<sockaddr*>(&bound), len, nullptr, 0, serv, sizeof(serv), NI_NUMERICSERV);
      result = std::atoi(serv);
      if (listening != nullptr) {
        *listening = fd;
      } else {
        ::close(fd);
      }
      break;
    }
    result = -errno;
    ::close(fd);
  }
  freeaddrinfo(found);
  return result;
}

// The store's listening socket, bound by the launcher of node 0 and handed to
// rank 0 (DDP_STORE_LISTEN_FD), so that the port is never free between the
// launcher choosing it and rank 0 serving on it; -1 on other nodes.
int gStoreListenFd = -1;

// Elastic jobs (--min-ranks): the store node 0's launcher serves, or a
// client of it on other nodes, for marking dead ranks.
std::shared_ptr<Store> gElasticStore;

pid_t spawnRank(const LaunchOptions& o, int localRank, int attempt, const std::string& token, int* outputFd,
                bool elasticJoin = false) {
  const int worldSize = o.nnodes * o.nprocPerNode;
  const int rank = o.nodeRank * o.nprocPerNode + localRank;
  EnvMap env = currentEnvironment();
  env["RANK"] = std::to_string(rank);
  env["LOCAL_RANK"] = std::to_string(localRank);
  env["WORLD_SIZE"] = std::to_string(worldSize);
  env["LOCAL_WORLD_SIZE"] = std::to_string(o.nprocPerNode);
  env["GROUP_RANK"] = std::to_string(o.nodeRank);
  env["MASTER_ADDR"] = o.masterAddr;
  env["MASTER_PORT"] = std::to_string(o.masterPort);
  env["DDP_RUN_LAUNCHED"] = "1";
  env["DDP_RESTART"] = std::to_string(attempt);
  if (!token.empty()) env["DDP_STORE_TOKEN"] = token;
  if (!o.storeUrl.empty()) {
    env["DDP_STORE_URL"] = o.minRanks > 0 ? o.storeUrl : fmt::format("{}/a{}", o.storeUrl, attempt);
  }
  if (!env.count("OMP_NUM_THREADS")) {
    unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    env["OMP_NUM_THREADS"] = std::to_string(std::max(1u, cores / static_cast<unsigned>(o.nprocPerNode)));
    env["DDP_RUN_THREADS_AUTO"] = "1";  // ours to lower when more ranks share the host (apps/ddp_run.cpp)
  }
  if (o.minRanks > 0) {
    env["DDP_MIN_RANKS"] = std::to_string(o.minRanks);
    env["DDP_STORE_SERVED"] = "1";
  }
  if (elasticJoin) {
    env["DDP_ELASTIC_JOIN"] = "1";
  } else {
    env.erase("DDP_ELASTIC_JOIN");
  }
  // Rank 0 alone inherits the store's socket: the others get it close-on-exec.
  const bool handSocket = rank == 0 && gStoreListenFd >= 0 && o.minRanks == 0;
  if (handSocket) {
    env["DDP_STORE_LISTEN_FD"] = std::to_string(gStoreListenFd);
    ::fcntl(gStoreListenFd, F_SETFD, 0);
  } else {
    env.erase("DDP_STORE_LISTEN_FD");
  }
  SpawnOptions spawn;
  spawn.argv = o.workerArgv;
  spawn.environment = std::move(env);
  spawn.captureOutput = true;
  spawn.ownProcessGroup = true;  // so that a kill reaches its children too
  // A launcher that is gone (SIGKILL, a crash) takes its ranks with it.
  // SIGTERM, not SIGKILL: a rank may end cleanly (a last checkpoint).
  spawn.dieWithParent = true;
  spawn.deathSignal = SIGTERM;
  spawn.inProcessEntry = o.workerEntry;
  ChildProcess child;
  try {
    child = spawnProcess(spawn);
  } catch (...) {
    if (handSocket) ::fcntl(gStoreListenFd, F_SETFD, FD_CLOEXEC);
    throw;
  }
  if (handSocket) ::fcntl(gStoreListenFd, F_SETFD, FD_CLOEXEC);
  logInfo("ddp-run: rank {} is pid {}, {}", rank, child.pid,
          child.inProcess ? "a copy of the launcher (no exec)" : "started with exec");
  *outputFd = child.outputFd;
  return child.pid;
}

// The rank's process group, or the rank alone if its group is gone.
void signalRank(pid_t pid, int signal) {
  if (::kill(-pid, signal) != 0 && errno == ESRCH) ::kill(pid, signal);
}

// write(2) until all of `text` is written (a full disk or a closed file
// just loses the rest of the log; the console still gets the line).
void writeLogText(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

// Each line is flushed at once: with stdout redirected to a file, a
// launcher killed later keeps what the ranks printed until then.
void forwardLine(RankProcess& p, const std::string& line, size_t keep) {
  if (p.logFd >= 0) writeLogText(p.logFd, line + "\n");
  if (p.toConsole) {
    // A line that names its rank already ("[rank 1] gloo: ...") is not
    // prefixed twice.
    const std::string own = fmt::format("[rank {}]", p.rank);
    if (p.prefixed && line.compare(0, own.size(), own) != 0) {
      std::cout << fmt::format("[rank {}] {}\n", p.rank, line) << std::flush;
    } else {
      std::cout << line << '\n' << std::flush;
    }
  }
  p.lastLines.push_back(line);
  while (p.lastLines.size() > keep) p.lastLines.pop_front();
}

// Reads what is available; returns false at end of output.
bool drain(RankProcess& p, size_t keep) {
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(p.outputFd, buf, sizeof(buf));
    if (n > 0) {
      p.partialLine.append(buf, static_cast<size_t>(n));
      size_t nl;
      while ((nl = p.partialLine.find('\n')) != std::string::npos) {
        forwardLine(p, p.partialLine.substr(0, nl), keep);
        p.partialLine.erase(0, nl + 1);
      }
      continue;
    }
    if (n == 0) {
      if (!p.partialLine.empty()) forwardLine(p, p.partialLine, keep);
      p.partialLine.clear();
      return false;
    }
    if (errno == EINTR) continue;
    return true;  // EAGAIN: nothing more for now
  }
}

std::string seconds(Clock::duration d) {
  return fmt::format("{:.1f} s", std::chrono::duration<double>(d).count());
}

struct AttemptResult {
  int code = 0;        // 0, the failure code, or 128 + stopSignal
  int stopSignal = 0;  // a signal to the launcher stopped the attempt
};

// How long the launcher waits, after a rank fails, before it stops the
// others. A rank that finds a mistake in the job (exit code 2) ends, and its
// peers then fail too ("lost the connection to the store"), sometimes
// before the first one has finished exiting; in this window both are
// reaped, and the cause is told from the consequence.
constexpr std::chrono::milliseconds kFailureWindow{500};

// Of the ranks that failed on their own, in the order they were reaped: the
// lowest rank that reported a mistake in the job (exit code 2) or a
// non-finite loss (3), as its peers fail only because it ended (rank 0 finds
// the run folder's mistakes and its peers pass them on, all with code 2,
// reaped in either order); else the first reaped that a signal ended (a
// killed rank's peers exit with 1 because it is gone, and on a busy machine
// one of them may be reaped in the same sweep, before it); else the first
// reaped.
int causeRank(const std::vector<RankProcess>& procs, const std::vector<int>& failed) {
  for (const int code : {2, 3}) {
    int lowest = -1;
    for (const int i : failed) {
      const int status = procs[static_cast<size_t>(i)].status;
      if (WIFEXITED(status) && WEXITSTATUS(status) == code && (lowest < 0 || i < lowest)) lowest = i;
    }
    if (lowest >= 0) return lowest;
  }
  for (const int i : failed) {
    if (WIFSIGNALED(procs[static_cast<size_t>(i)].status)) return i;
  }
  return failed.front();
}

// One attempt of the whole job on this node.
AttemptResult runOnce(const LaunchOptions& o, int attempt, const std::string& token, StopSignals& signals) {
  int elasticRestarts = 0;  // ranks started again to rejoin
  int belowMinimum = -1;    // a rank that ended with kExitBelowMinRanks
  bool stalled = false;     // a rank ended with kExitStalled
  std::vector<RankProcess> procs(o.nprocPerNode);
  struct CloseLogs {
    std::vector<RankProcess>& procs;
    ~CloseLogs() {
      for (auto& p : procs) {
        if (p.logFd >= 0) ::close(p.logFd);
      }
    }
  } closeLogs{procs};
  for (int i = 0; i < o.nprocPerNode; ++i) {
    procs[i].rank = o.nodeRank * o.nprocPerNode + i;
    const bool filtered = !o.consoleLocalRanks.empty();
    procs[i].toConsole =
        filtered ? std::find(o.consoleLocalRanks.begin(), o.consoleLocalRanks.end(), i) != o.consoleLocalRanks.end()
                 : (o.logDir.empty() || o.tee || i == 0);
    procs[i].prefixed = o.tee || procs[i].rank != 0;
    if (!o.logDir.empty()) {
      const std::string path = fmt::format("{}/rank_{}.log", o.logDir, procs[i].rank);
      procs[i].logFd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (procs[i].logFd < 0) {
        fail<UsageError>("ddp-run: --log-dir: cannot open {}: {}", path, errnoText(errno));
      }
      if (attempt > 0) writeLogText(procs[i].logFd, fmt::format("== ddp-run: attempt {} ==\n", attempt + 1));
    }
  }
  // Logs are open before any rank starts: a log that cannot be opened
  // leaves no rank behind. A stop signal while ranks start ends the
  // starting: those started are stopped below as after any signal (starting
  // hundreds of ranks takes minutes).
  int signalWhileStarting = 0;
  int started = 0;
  for (int i = 0; i < o.nprocPerNode; ++i) {
    try {
      procs[i].pid = spawnRank(o, i, attempt, token, &procs[i].outputFd, /*elasticJoin=*/o.replacesNode);
      ++started;
    } catch (...) {
      for (int j = 0; j < i; ++j) {
        signalRank(procs[j].pid, SIGKILL);
        ::waitpid(procs[j].pid, nullptr, 0);
        ::close(procs[j].outputFd);
      }
      throw;
    }
    if ((signalWhileStarting = signals.take()) != 0) break;
  }
  for (int i = started; i < o.nprocPerNode; ++i) procs[i].exited = true;  // never started
  const size_t keep = static_cast<size_t>(o.lastLinesKept);
  int firstFailure = -1;
  std::vector<int> failedOnTheirOwn;  // local ranks, in the order they were reaped
  bool stopping = false;              // the others have been told to stop after a failure
  int stopSignal = 0;
  const Clock::time_point noDeadline = Clock::time_point::max();
  Clock::time_point stopAt = noDeadline;  // when the others get SIGTERM after a failure
  Clock::time_point killDeadline = noDeadline;  // set once the ranks are being stopped
  Clock::time_point stopStart{};
  int killedHard = 0;  // ranks that SIGKILL ended
  bool killedForSecondSignal = false;  // not for the grace period
  auto stopAll = [&](int signal) {
    for (auto& q : procs) {
      if (!q.exited) signalRank(q.pid, signal);
    }
  };
  auto killSurvivors = [&] {
    for (auto& q : procs) {
      if (!q.exited) ++killedHard;
    }
    stopAll(SIGKILL);
  };
  if (signalWhileStarting != 0) {
    stopSignal = signalWhileStarting;
    stopStart = Clock::now();
    stopAll(stopSignal);
    killDeadline = stopStart + o.killGrace;
  }
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<RankProcess*> owners;
    for (auto& p : procs) {
      if (p.outputFd >= 0) {
        fds.push_back({p.outputFd, POLLIN, 0});
        owners.push_back(&p);
      }
    }
    fds.push_back({signals.fd(), POLLIN, 0});
    while (::poll(fds.data(), fds.size(), 100) < 0 && errno == EINTR) {
    }
    for (size_t i = 0; i < owners.size(); ++i) {
      if (fds[i].revents && !drain(*owners[i], keep)) {
        ::close(owners[i]->outputFd);
        owners[i]->outputFd = -1;
      }
    }
    if (const int signal = signals.take()) {
      if (stopSignal == 0) {
        // Forwarded as it came (Ctrl-C reaches only the launcher's group);
        // a second signal does not wait for the grace period.
        stopSignal = signal;
        stopStart = Clock::now();
        stopAll(signal);
        if (killDeadline == noDeadline) killDeadline = stopStart + o.killGrace;
      } else if (killedHard == 0) {
        killedForSecondSignal = true;
        killSurvivors();
      }
    }
    bool allExited = true;
    for (auto& p : procs) {
      if (p.exited) continue;
      int status = 0;
      pid_t r = ::waitpid(p.pid, &status, WNOHANG);
      if (r == p.pid) {
        p.exited = true;
        p.status = status;
        const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        if (o.minRanks > 0 && failed && code == kExitBelowMinRanks) {
          if (belowMinimum < 0) belowMinimum = p.rank - o.nodeRank * o.nprocPerNode;
          continue;
        }
        if (o.minRanks > 0 && failed && code == kExitStalled) {
          stalled = true;  // every rank stops so; none restarts
          continue;
        }
        if (o.minRanks > 0 && failed && stopSignal == 0 && !stopping && code != 2 && code != 3) {
          // Elastic: the others carry on without it; it may come back.
          // A store that is gone too (node 0's host, with a TCPStore)
          // leaves the survivors to notice the death themselves.
          // A rank left out (kExitExcluded) is in no membership: its id may
          // be a replacement's now, which a dead mark would end.
          bool storeLost = false;
          try {
            if (gElasticStore && code != kExitExcluded) ElasticRendezvous::markDead(*gElasticStore, p.rank);
          } catch (const StoreError& e) {
            storeLost = true;
            std::cerr << fmt::format("ddp-run: could not mark rank {} dead in the store: {}\n", p.rank, e.what());
          }
          if (p.outputFd >= 0) {
            drain(p, keep);
            ::close(p.outputFd);
            p.outputFd = -1;
          }
          // Nothing to rejoin once the members are past their last step.
          bool over = storeLost;
          try {
            over = over || (gElasticStore && ElasticRendezvous::finished(*gElasticStore));
          } catch (const StoreError&) {
            over = true;  // no store, no rejoin
          }
          // Left out for its host's slow link: started again, it would meet the same link.
          const bool slowHost = code == kExitSlowHost;
          const bool again = attempt + elasticRestarts < o.maxRestarts && !over && !slowHost;
          std::cerr << fmt::format("ddp-run: rank {} (pid {}) {}; the others carry on{}\n", p.rank, p.pid,
                                   describeExitStatus(status),
                                   again ? fmt::format(", and it restarts to rejoin (restart {} of {})",
                                                       attempt + elasticRestarts + 1, o.maxRestarts)
                                   : over     ? std::string(" to the end of their training; it does not restart")
                                   : slowHost ? std::string("; its host's link is too slow: it does not restart")
                                              : "")
                    << std::flush;
          if (again) {
            ++elasticRestarts;
            p.pid = spawnRank(o, p.rank - o.nodeRank * o.nprocPerNode, attempt, token, &p.outputFd,
                              /*elasticJoin=*/true);
            p.exited = false;
            p.partialLine.clear();
            allExited = false;
          }
          continue;
        }
        if (failed && stopSignal == 0 && !stopping) {
          // The cause is chosen among the ranks that fail on their own
          // before the others are stopped (causeRank).
          failedOnTheirOwn.push_back(p.rank - o.nodeRank * o.nprocPerNode);
          if (stopAt == noDeadline) stopAt = Clock::now() + kFailureWindow;
        }
      } else {
        allExited = false;
      }
    }
    if (!stopping && stopAt != noDeadline && (Clock::now() >= stopAt || allExited)) {
      stopping = true;
      firstFailure = causeRank(procs, failedOnTheirOwn);
      stopAll(SIGTERM);
      killDeadline = Clock::now() + o.killGrace;
    }
    if (!allExited && killedHard == 0 && Clock::now() >= killDeadline) killSurvivors();
    if (allExited) {
      for (auto& p : procs) {
        if (p.outputFd >= 0) {
          drain(p, keep);
          ::close(p.outputFd);
          p.outputFd = -1;
        }
      }
      break;
    }
  }
  // Every rank is reaped: a segment that one left in /dev/shm (killed while
  // it set the segment up) can go now, and no rank of ours uses it.
  std::vector<pid_t> pids;
  for (const auto& p : procs) {
    if (p.pid > 0) pids.push_back(p.pid);
  }
  for (const auto& name : removeSharedMemoryOf(pids)) {
    logInfo("ddp-run: removed {}, left by a stopped rank", name);
  }
  if (firstFailure >= 0) {
    const RankProcess& f = procs[firstFailure];
    std::string report = fmt::format("ddp-run: rank {} (pid {}) failed first: {}; stopped the other ranks.\n", f.rank,
                                     f.pid, describeExitStatus(f.status));
    // Lines the console showed already are not repeated; a rank whose
    // lines went elsewhere (--local-ranks-filter, --log-dir) has its last
    // ones shown here.
    const bool shown = f.toConsole;
    if (!shown && !f.lastLines.empty()) {
      report += fmt::format("ddp-run: last lines of rank {}:\n", f.rank);
      for (const auto& line : f.lastLines) report += fmt::format("  | {}\n", line);
    }
    std::cerr << report << std::flush;
  }
  if (stopSignal != 0) {
    std::string line =
        started < o.nprocPerNode
            ? fmt::format("ddp-run: received {} while starting ranks; stopped the {} of {} started (ranks {}..{}) in {}",
                          signalName(stopSignal), started, o.nprocPerNode, procs.front().rank,
                          procs[started - 1].rank, seconds(Clock::now() - stopStart))
            : fmt::format("ddp-run: received {}; stopped ranks {}..{} in {}", signalName(stopSignal),
                          procs.front().rank, procs.back().rank, seconds(Clock::now() - stopStart));
    if (killedHard > 0 && killedForSecondSignal) {
      line += fmt::format(" ({} of them with SIGKILL, after a second signal)", killedHard);
    } else if (killedHard > 0) {
      line += fmt::format(" ({} of them with SIGKILL, after the {} grace period of --kill-grace)", killedHard,
                          seconds(o.killGrace));
    }
    std::cerr << line << std::endl;
    return {128 + stopSignal, stopSignal};
  }
  if (stalled && firstFailure < 0) {
    std::cerr << "ddp-run: the job stopped: a collective kept timing out with every rank alive; the rank with the "
                 "state saved a checkpoint (--resume with a larger distributed.timeout_s continues from it)"
              << std::endl;
    return {kExitStalled, 0};
  }
  if (belowMinimum >= 0 && firstFailure < 0) {
    std::cerr << fmt::format("ddp-run: the job went below --min-ranks {}; the survivors saved a checkpoint (--resume "
                             "continues from it)",
                             o.minRanks)
              << std::endl;
    return {kExitBelowMinRanks, 0};
  }
  if (firstFailure < 0) {
    // Elastic: success when some rank finished; every rank lost is a failure.
    if (o.minRanks > 0 && std::none_of(procs.begin(), procs.end(), [](const RankProcess& p) {
          return WIFEXITED(p.status) && WEXITSTATUS(p.status) == 0;
        })) {
      std::cerr << (o.nnodes > 1 ? fmt::format("ddp-run: every rank of node {} was lost (the other nodes' may train on)",
                                               o.nodeRank)
                                 : std::string("ddp-run: every rank was lost"))
                << std::endl;
      return {1, 0};
    }
    return {};
  }
  const RankProcess& f = procs[firstFailure];
  // The rank's own code (2: a mistake in what was asked) where it exited; 1
  // where a signal ended it.
  return {WIFEXITED(f.status) ? WEXITSTATUS(f.status) : 1, 0};
}

}  // namespace

void checkPortFree(const std::string& host, int port) {
  int r = tryBind(host, port);
  if (r == -EADDRINUSE) {
    fail<UsageError>("ddp-run: MASTER_PORT {} on {} is already in use. HINT: pass --master-port with a free port (or 0 "
                     "to pick one), or stop the process that holds it (ss -ltnp 'sport = :{}')",
                     port, host, port);
  }
  if (r < 0) {
    fail<UsageError>("ddp-run: cannot bind {}:{}: {}. HINT: --master-addr must be an address of the node with "
                     "--node-rank 0",
                     host, port, errnoText(-r));
  }
}

int listenForStore(const std::string& host, int port, int* fd) {
  const int r = tryBind(host, port, fd);
  if (r == -EADDRINUSE || (r < 0 && port != 0)) checkPortFree(host, port);  // the same words as before
  if (r <= 0) fail<UsageError>("ddp-run: cannot listen on {}:{}: {}", host, port, errnoText(-r));
  return r;
}

int pickFreePort(const std::string& host) {
  int r = tryBind(host, 0);
  if (r <= 0) fail<UsageError>("ddp-run: cannot find a free port on {}: {}", host, errnoText(-r));
  return r;
}

int launchLocalRanks(LaunchOptions o) {
  if (o.nprocPerNode < 1) throw UsageError("ddp-run: --nproc-per-node must be at least 1");
  if (o.nnodes < 1) throw UsageError("ddp-run: --nnodes must be at least 1");
  if (o.nodeRank < 0 || o.nodeRank >= o.nnodes) {
    fail<UsageError>("ddp-run: --node-rank {} is outside [0, {})", o.nodeRank, o.nnodes);
  }
  if (o.masterPort == 0 && o.nnodes > 1) {
    throw UsageError("ddp-run: a multi-node job needs --master-port (the same on every node)");
  }
  // A node that cannot be a replacement (no etcd, or no --min-ranks) runs
  // the caller's fresh-start check first, before it takes a port or a store.
  if (o.freshStartCheck && (o.minRanks <= 0 || o.storeUrl.empty())) {
    o.freshStartCheck();
    o.freshStartCheck = nullptr;
  }
  if (o.nodeRank == 0 && o.storeUrl.empty()) {
    // Bound and listening from now to the end of the job: rank 0 serves the
    // store on this very socket, so no other process can take the port.
    o.masterPort = listenForStore(o.masterAddr, o.masterPort, &gStoreListenFd);
  }
  std::string token;
  if (const char* t = std::getenv("DDP_STORE_TOKEN")) token = t;
  if (token.empty() && o.nnodes == 1) token = randomHex(16);
  if (o.minRanks > 0) {
    // Elastic: every node's launcher marks its own dead ranks in the job's
    // store, which outlives every rank: etcd, or node 0's launcher serves it.
    if (!o.storeUrl.empty()) {
      EtcdStoreOptions eo;
      parseEtcdUrl(o.storeUrl, &eo);
      eo.token = token;
      eo.tokenFromEnvironment = token.empty();
      // Marking a rank dead runs inside the loop that reaps ranks and
      // forwards signals: an etcd that does not answer must not hold it long.
      eo.connectTimeout = std::chrono::seconds(15);
      eo.timeout = std::chrono::seconds(15);
      gElasticStore = std::make_shared<EtcdStore>(eo);
    } else {
      TCPStoreOptions so;
      so.host = o.masterAddr;
      so.port = static_cast<uint16_t>(o.masterPort);
      so.isServer = o.nodeRank == 0;
      so.listenFd = o.nodeRank == 0 ? gStoreListenFd : -1;
      so.token = token;
      so.tokenFromEnvironment = token.empty();
      gElasticStore = std::make_shared<TCPStore>(so);
    }
  }

  const int worldSize = o.nnodes * o.nprocPerNode;
  if (gElasticStore && !(o.nodeRank == 0 && o.storeUrl.empty())) {
    // A node whose own ranks arrived in this store before replaces a lost
    // one (the same command, on a new host): its ranks join, provided the
    // job is alive (another node's member beats). Otherwise the store
    // holds a job that is over or gone.
    const int first = o.nodeRank * o.nprocPerNode;
    bool before = false, alive = false, over = false, ownAlive = false;
    try {
      before = arrivedBefore(*gElasticStore, worldSize, first, o.nprocPerNode);
      if (before) {
        over = ElasticRendezvous::finished(*gElasticStore);
        std::vector<int> others;
        for (int id = 0; id < worldSize; ++id) {
          if (id < first || id >= first + o.nprocPerNode) others.push_back(id);
        }
        alive = !over && ElasticRendezvous::anyAlive(*gElasticStore, others, std::chrono::seconds(2));
        // Its own ranks of before must be gone: a node cut off, or the same
        // command started twice, is not a lost node to replace.
        std::vector<int> own;
        for (int id = first; id < first + o.nprocPerNode; ++id) own.push_back(id);
        ownAlive = alive && ElasticRendezvous::anyAlive(*gElasticStore, own, std::chrono::seconds(2));
      }
    } catch (const StoreError& e) {
      fail<StoreError>("ddp-run: node {}: cannot read the job's store at start: {}", o.nodeRank, e.what());
    }
    if (before && !alive) {
      fail<UsageError>("ddp-run: node {}: this job's store already holds its ranks {}..{} from a run that is {}; it is "
                       "not a running job to rejoin. HINT: a new job needs a new --rdzv-id",
                       o.nodeRank, first, first + o.nprocPerNode - 1,
                       over ? "over" : "gone (no member's heartbeat moves)");
    }
    if (before && ownAlive) {
      fail<UsageError>("ddp-run: node {}: its ranks {}..{} of this job still beat in the store: the node is not lost, "
                       "so there is nothing to replace. HINT: is the same command running on another host? A new "
                       "job needs a new --rdzv-id",
                       o.nodeRank, first, first + o.nprocPerNode - 1);
    }
    if (before) {
      o.replacesNode = true;
      std::cout << fmt::format("ddp-run: node {}: the job is running and its ranks {}..{} arrived before: this node "
                               "replaces a lost one; its ranks join at the next step boundary\n",
                               o.nodeRank, first, first + o.nprocPerNode - 1)
                << std::flush;
    }
  }
  if (!o.replacesNode && o.freshStartCheck) o.freshStartCheck();

  // From here on SIGINT, SIGTERM and SIGHUP stop the ranks first.
  StopSignals signals;
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  std::cout << fmt::format("ddp-run: world size {} = {} node(s) x {} rank(s); master {}:{}; backend {}\n", worldSize,
                           o.nnodes, o.nprocPerNode, o.masterAddr, o.masterPort, o.backend);
  std::cout << fmt::format("ddp-run: node {} ({}) runs ranks {}..{}", o.nodeRank, host, o.nodeRank * o.nprocPerNode,
                           (o.nodeRank + 1) * o.nprocPerNode - 1)
            << std::endl;
  const unsigned cores = std::thread::hardware_concurrency();
  if (cores > 0 && static_cast<unsigned>(o.nprocPerNode) > cores) {
    std::cerr << fmt::format("ddp-run: note: {} ranks on this node (--nproc-per-node) for {} cores: the ranks share "
                             "the cores (fine for testing a world size; for speed, at most {} ranks)\n",
                             o.nprocPerNode, cores, cores)
              << std::flush;
  }

  auto stoppedBetweenAttempts = [](int signal) {
    std::cerr << fmt::format("ddp-run: received {}; no rank is running, not restarting", signalName(signal))
              << std::endl;
    return 128 + signal;
  };
  for (int attempt = 0;; ++attempt) {
    if (const int signal = signals.take()) return stoppedBetweenAttempts(signal);
    const AttemptResult result = runOnce(o, attempt, token, signals);
    const int code = result.code;
    if (code == 0 || result.stopSignal != 0) return code;  // a signal: never a restart
    // 2: a mistake in what was asked (config, environment), the same again
    // on every attempt; restarts are for failures that may pass.
    // 3: a non-finite loss, which a restart from the newest checkpoint
    // would reach again (the run is deterministic).
    if ((code == 2 || code == 3) && o.maxRestarts > 0) {
      std::cerr << (code == 2 ? "ddp-run: not restarting: the rank reported a mistake in the job's input (exit code 2)"
                              : "ddp-run: not restarting: the loss became non-finite (exit code 3); a restart from "
                                "the newest checkpoint would reach it again")
                << std::endl;
      return code;
    }
    if (attempt >= o.maxRestarts) {
      if (o.maxRestarts > 0) {
        std::cerr << fmt::format("ddp-run: giving up after {} restart(s)", o.maxRestarts) << std::endl;
      }
      return code;
    }
    std::cerr << fmt::format("ddp-run: restarting all ranks from the newest checkpoint (restart {} of {})", attempt + 1,
                             o.maxRestarts)
              << std::endl;
    if (o.nodeRank == 0) {
      // The failed master may leave its port in TIME_WAIT briefly; SO_REUSEADDR
      // copes. A signal meanwhile ends the wait (and the job, above).
      pollfd wake{signals.fd(), POLLIN, 0};
      ::poll(&wake, 1, 200);
    }
  }
}

}  // namespace ddp
