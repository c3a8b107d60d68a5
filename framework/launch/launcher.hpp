// Launcher: the part of ddp-run that starts this node's ranks, as torchrun
// and mp.spawn do, and stops the whole job as soon as one rank fails.
//
// Contract
// - Starts nprocPerNode copies of workerArgv, with RANK = nodeRank *
//   nprocPerNode + localRank, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
//   GROUP_RANK, MASTER_ADDR, MASTER_PORT, DDP_STORE_TOKEN (generated for a
//   one-node job when unset) and OMP_NUM_THREADS = cores / nprocPerNode
//   unless the user set it.
// - Forwards each rank's output line by line (ranks other than 0 prefixed
//   "[rank r]") and keeps its last lines.
// - Fail-fast: when a rank exits non-zero or dies by a signal, the others get
//   SIGTERM half a second later, then SIGKILL after a grace period; the
//   launcher prints which rank failed first, how, and that rank's last
//   lines, and returns its exit code. Of the ranks that failed in that half
//   second, one that exited with code 2 (a mistake in the job) or 3 (a
//   non-finite loss) is named as the cause: its peers failed because it
//   ended.
// - With maxRestarts > 0, a failed job is started again (all ranks, with
//   DDP_RESTART=<attempt>) until it succeeds or the restarts are used up.
//   Exit codes that a restart would only repeat end the job at once: 2 (a
//   mistake in the job's input) and 3 (a non-finite loss).
//   Each node's launcher restarts on its own, when its ranks see the
//   failure: a restarted rank waits for the other nodes' ranks as long as
//   it would to reach the master (60 s, or distributed.timeout_s if
//   longer), so that nodes that noticed it later (a timeout later, or when
//   their link came back) still meet it (launch/distributed.cpp). A node
//   gone for good ends the job once the restarts are spent.
// - Elastic (minRanks > 0): node 0's launcher serves the store itself
//   (DDP_STORE_SERVED=1: it outlives every rank), or with storeUrl the
//   store is etcd, and every rank gets DDP_MIN_RANKS. Every node's launcher
//   holds a handle on the store and marks its own dead ranks. A rank that
//   ends with any code but 0, 2, 3 or 4 (or a signal) does not stop the
//   others: it is marked dead in the store (so
//   the survivors' new membership need not wait for it) and, while
//   maxRestarts allows (a budget for the whole job), started again with
//   DDP_ELASTIC_JOIN=1 to rejoin. Codes 2 and 3 fail fast as always; 4
//   (below the minimum: the survivors saved a checkpoint) ends the job with
//   4. Otherwise the job succeeds when every rank still running ends with 0.
// - Signals: SIGINT, SIGTERM and SIGHUP to the launcher (those it does not
//   ignore) are passed on to every rank's process group; ranks still alive
//   after killGrace get SIGKILL (at once on a second signal). The launcher
//   prints one line naming the signal, never restarts, and returns 128 +
//   the signal. Ranks get SIGTERM when the launcher is gone without that
//   (PR_SET_PDEATHSIG), so no rank outlives a killed launcher.
// - Once an attempt's ranks are reaped, /dev/shm segments named after their
//   pids (core/shm_names.hpp: left by a rank killed while setting one up)
//   are removed.
// - Everything it writes to stdout is flushed line by line, so a redirected
//   output keeps what the ranks printed even if the launcher is killed.
// - workerEntry (optional): the function a rank's copy of this process
//   runs instead of exec'ing workerArgv[0] again (spawn.hpp's
//   inProcessEntry), when the launcher is single-threaded at the time (an
//   elastic launcher serves the store on a thread, so its ranks exec).
//   Either way the rank gets the same argv and environment.
// - More local ranks than cores: a note (testing a world size on a small
//   machine is legitimate), not an error.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace ddp {

struct LaunchOptions {
  int nprocPerNode = 1;
  int nnodes = 1;
  int nodeRank = 0;
  std::string masterAddr = "127.0.0.1";
  int masterPort = 0;  // 0: pick a free port (one-node jobs only)
  int maxRestarts = 0;
  // Elastic (--min-ranks, launch/elastic.hpp): > 0 keeps the others running
  // when a rank fails; see launchLocalRanks.
  int minRanks = 0;
  std::string backend = "gloo";  // only for the printed mapping
  std::vector<std::string> workerArgv;
  std::function<int(const std::vector<std::string>&)> workerEntry;
  std::chrono::milliseconds killGrace{3000};  // --kill-grace
  int lastLinesKept = 20;
  // --log-dir: every rank's output also goes to DIR/rank_<global rank>.log
  // (appended, line by line; a restart starts with an "attempt N" line).
  std::string logDir;
  // Which ranks' lines reach the console: consoleLocalRanks (local ranks,
  // --local-ranks-filter) if set; else all, or with a logDir only local
  // rank 0 unless tee (--tee). Lines of ranks other than global rank 0
  // carry "[rank r] "; with tee every line does.
  std::vector<int> consoleLocalRanks;
  bool tee = false;
  // --rdzv-backend etcd: the job's store is etcd at this URL
  // ("etcd://HOST:PORT[,...]/ddp/<rdzv-id>", store/etcd_store.hpp), not
  // a TCPStore of node 0: no node serves anything, and losing any host
  // leaves the store. The ranks get it as DDP_STORE_URL (with "/a<attempt>"
  // appended unless elastic, so that a restart starts on clean keys).
  std::string storeUrl;
  // Set by launchLocalRanks, not by the caller: with --min-ranks, a node
  // whose own ranks arrived in the store before, while another node's
  // members still beat and its own do not, replaces a lost node: its ranks
  // start as joiners (DDP_ELASTIC_JOIN=1) and are admitted at a step
  // boundary. Found there with no member beating (a job over or gone under
  // this --rdzv-id), it stops with a HINT; so does a node whose own ranks
  // still beat (not lost: cut off, or started twice). Node 0 is replaced
  // as any other (with etcd: with node 0's TCP store the job went with it):
  // a joiner never takes over the run folder's writing (elastic.hpp keeps
  // the members' order), so rank 0's run folder stays with the member that
  // writes it.
  bool replacesNode = false;
  // Run before any rank starts, unless this node replaces a lost one: the
  // caller's check of a fresh start (ddp-run: the run folder is free).
  std::function<void()> freshStartCheck;
};

// Runs the job; returns the exit code for ddp-run: 0 on success, 128 + the
// signal that stopped it, else that of the rank that failed first (1 where a
// signal ended it).
int launchLocalRanks(LaunchOptions options);

// Throws UsageError naming the port when host:port cannot be bound.
void checkPortFree(const std::string& host, int port);

// A socket bound to host:port (0: a free port) and listening, close-on-exec,
// in *fd; returns its port. Throws UsageError as checkPortFree does.
int listenForStore(const std::string& host, int port, int* fd);

// A port that was free a moment ago on host.
int pickFreePort(const std::string& host);

}  // namespace ddp
