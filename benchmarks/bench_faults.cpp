// `ddp-bench faults`: what a lost host costs a job that recovers in place
// (ddp-run --min-ranks), on a simulated cluster (sim_cluster.hpp) whose
// store is etcd on a service node, so that no training host holds it.
//
// One run per fault, each a fresh job (--rdzv-id of its own) of H launchers,
// one per host (--hosts HxR), training the experiment (default: wine, 12
// epochs, a step record per step), plus one unfailed run for reference. The
// faults, all on the last host (the highest ranks; for `recovery` the two
// last hosts):
//   host        every process of the host SIGKILLed (ddp-bench kills the
//               namespace) once step --at-step is recorded: a power loss
//               (steps take 20 ms here, as for link and recovery,
//               DDP_FAULT_SLOW: on a busy machine this loop may act seconds
//               after the record);
//   collective  the host's first rank waits 300 ms after step --at-step,
//               then kills its whole host (DDP_FAULT_INJECT
//               R@S:delay=300:host): the others are inside step S+1's
//               gradient collective, waiting for it, when it dies;
//   link        the host's interface goes down at step --at-step for
//               distributed.timeout_s + 3 s (--cut-s), then up again: no connection
//               is closed, so the others time out, then find its
//               heartbeat silent and decide without it; when it returns,
//               its ranks must be told they were left out and exit;
//   recovery    as host, and the next host dies too (DDP_FAULT_RECOVERY
//               ID:host) once the survivors have decided their first new
//               membership, inside the recovery;
//   replace     as host, and once the others train on without it, its
//               launcher is started again on that host, the same command:
//               a replacement node, whose ranks join at a step boundary.
//               (Steps take 30 ms here, DDP_FAULT_SLOW, and the members
//               wait for the joiner after step --at-step + 10,
//               DDP_FAULT_AWAIT_JOIN, so that the job is still running when
//               it comes, however slowly it starts.)
//   slow        the host's link is at --slow-link (10 Mbit/s) from the
//               job's start (not at --at-step: on a busy machine this loop
//               falls behind the job's short epochs); its collectives still fit
//               distributed.timeout_s: it must keep the host, end at the
//               full world, and name the host and its ranks in the
//               straggler report (the links are probed at each epoch end);
//   slow-timeout  the same link, under a model whose gradients take longer
//               than distributed.timeout_s to cross it (the MLP's hidden
//               layer widened to that size): a collective times out with
//               every rank alive, the recovery's probe of the links finds
//               the host, and it is left out; its ranks say so and exit.
//               (20 epochs at most: the wider model's steps are slower.)
//               On 2 hosts the one link between them cannot be blamed on
//               either: after 3 timeouts at one step the job stops, with a
//               checkpoint and a line that says so (outcome "stopped").
// For each: the survivors' launchers must exit 0, every optimizer step be
// recorded once (steps.jsonl: 1..N, no gap, no repeat), and the final test
// accuracy be within --tolerance of the unfailed run's. The record:
// fault, recovered_s (from the fault to the first step completed after it,
// i.e. at the smaller world: detection plus recovery plus that step; for
// `collective` the fault is the step's record plus the 300 ms), reported_s (the trainer's own
// "recovered in" figure: from detection to the new group), steps,
// steps_lost (steps recorded twice), final_world, test_accuracy,
// exit_code (the survivors' worst, the replacement's included),
// victim_exit_codes, victim_line (the cut host's last word, for link),
// decided_by (heartbeat, death or settle: what let the survivors go on
// without the victims, from their log) and rejoined_s (replace: from the replacement's start to the first step at
// the full world again). Exit status 1 if a check failed.
//
// --restarts N: host, collective and link (--restart-faults) run once
// more each under ddp-run --max-restarts N instead of --min-ranks (a
// checkpoint each epoch), the way torchrun's users recover: every rank
// stops and starts again from the newest checkpoint, and the job needs
// every host back. Their records have recovery "restart" (the others
// "in-place"), recovered_s up to the first step a restarted rank completed,
// steps_lost (the steps done again since that checkpoint), restarts (the
// most that any host's launcher made) and outcome: "recovered", or "ended"
// (a host gone for good; ended_s: from the fault to the last launcher's
// exit). Measured here; tests/bench/faults_test.sh checks a restarted link.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "benchmarks/bench_util.hpp"
#include "benchmarks/commands.hpp"
#include "ddp/config.hpp"
#include "framework/launch/spawn.hpp"

namespace ddp::bench {
namespace faults {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string hosts = "3x1";
  std::string link = "1gbit";
  std::vector<std::string> faults = {"host", "collective", "link", "recovery", "replace", "slow", "slow-timeout"};
  std::string slowLink = "10mbit";
  std::string experiment = std::string(DDP_SOURCE_DIR) + "/experiments/wine_baseline.json";
  std::vector<std::string> overrides;
  int64_t epochs = 60;
  int64_t atStep = 9;
  int minRanks = 1;
  double timeoutS = 5;
  double tolerance = 0.05;
  int timeLimitS = 300;
  double cutS = 0;  // link: how long the link stays down (0: distributed.timeout_s + 3)
  int restarts = 0;  // > 0: restartFaults also under ddp-run --max-restarts, for comparison
  std::vector<std::string> restartFaults = {"host", "collective", "link"};
  std::string jsonPath;
  std::string keepDir;  // the jobs' run folders and logs go here, and stay
};

constexpr int kCollectiveDelayMs = 300;
constexpr int kEtcdPort = 2379;

double wallNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string ddpRunPath() {
  const auto sibling = std::filesystem::read_symlink("/proc/self/exe").parent_path() / "ddp-run";
  return std::filesystem::exists(sibling) ? sibling.string() : std::string(DDP_RUN_PATH);
}

// `argv` with its stdout and stderr to `log` (a shell's exec: the pid stays the program's).
std::vector<std::string> loggedTo(const std::string& log, std::vector<std::string> argv) {
  argv.insert(argv.begin(), {"/bin/sh", "-c", "exec \"$@\" > \"$0\" 2>&1", log});
  return argv;
}

std::vector<json> readRecords(const std::string& path) {
  std::vector<json> records;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    try {
      records.push_back(json::parse(line));
    } catch (const json::exception&) {
      break;  // a line being written
    }
  }
  return records;
}

std::string readText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The last line of `text` that contains `needle`, or "".
std::string lastLineWith(const std::string& text, const std::string& needle) {
  std::istringstream lines(text);
  std::string found;
  for (std::string line; std::getline(lines, line);) {
    if (line.find(needle) != std::string::npos) found = line;
  }
  return found;
}

int exitCode(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

// etcd in the switch's namespace: the service node every host reaches.
class ServiceEtcd {
 public:
  ServiceEtcd(const SimCluster& cluster, const std::string& dir) {
    const std::string& ip = cluster.serviceAddress();
    endpoint_ = fmt::format("{}:{}", ip, kEtcdPort);
    const std::string client = "http://" + endpoint_, peer = fmt::format("http://{}:{}", ip, kEtcdPort + 1);
    SpawnOptions options;
    options.argv = cluster.wrapService(loggedTo(dir + "/etcd.log",
                                                {"/usr/bin/etcd", "--name", "svc", "--data-dir", dir + "/etcd",
                                                 "--listen-client-urls", client, "--advertise-client-urls", client,
                                                 "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                                                 "--initial-cluster", "svc=" + peer, "--log-level", "error"}));
    options.program = options.argv[0];
    options.dieWithParent = true;
    pid_ = spawnProcess(options).pid;
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    for (;;) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        throw BenchError(fmt::format("etcd on {} {}: {}", endpoint_, describeExitStatus(status),
                                     readText(dir + "/etcd.log")));
      }
      if (const int sig = stopSignal()) {
        stop();
        throw BenchError(fmt::format("stopped by signal {} while etcd started", sig));
      }
      SpawnOptions probe;
      probe.argv = cluster.wrapService({"/usr/bin/etcdctl", "--endpoints", endpoint_, "endpoint", "health"});
      probe.program = probe.argv[0];
      EnvMap env = currentEnvironment();
      env["ETCDCTL_API"] = "3";
      probe.environment = env;
      const int health = runProcess(probe).status;
      if (WIFEXITED(health) && WEXITSTATUS(health) == 0) break;
      if (Clock::now() > deadline) {
        stop();
        throw BenchError(fmt::format("etcd at {} is not healthy after 30 s: {}", endpoint_, readText(dir + "/etcd.log")));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  ~ServiceEtcd() { stop(); }
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  const std::string& endpoint() const { return endpoint_; }

 private:
  pid_t pid_ = -1;
  std::string endpoint_;
};

struct Job {
  std::string fault;
  bool restart = false;  // under --max-restarts (no --min-ranks): every rank restarts from the newest checkpoint
  std::string dir;
  std::vector<pid_t> pids;
  std::vector<int> exitCodes;
  std::set<int> victims;  // hosts
  double faultTime = 0;   // wall clock
  double replacedTime = 0;  // replace: when the replacement started
  double endTime = 0;       // wall clock: when the last launcher was seen to exit
  int replacementExit = -1;
};

// How long `link` keeps the link down: past the others' collective timeout
// and past the time their rendezvous waits for a member whose heartbeat
// stands still (elastic.hpp's silentAfter, 1.5 s), so that they decide
// without the cut host; 3 s past the timeout. (A cut that ends before the
// decision sees the host admitted again, given the state of the member
// furthest on: nothing stale, but not the fault asked for.)
double linkCutSeconds(const Options& o) { return o.cutS > 0 ? o.cutS : o.timeoutS + 3; }

// How long a restart job may take: a host gone for good is waited for in
// each restart's rendezvous (60 s, or the timeout if longer) before the
// job ends.
int jobTimeLimit(const Options& o, bool restart) {
  if (!restart) return o.timeLimitS;
  return o.timeLimitS + o.restarts * static_cast<int>(std::max(o.timeoutS, 60.0) + 10);
}

// slow-timeout's model: the experiment's MLP with its hidden layer as wide
// as it takes for one gradient allreduce through the slow link to need 3x
// distributed.timeout_s (each rank sends about 2 (W - 1) / W of the
// gradients' bytes, and a slow host's every byte crosses its link).
std::string slowTimeoutLayers(const Options& o, const HostLayout& layout) {
  std::ifstream in(o.experiment);
  const json experiment = json::parse(in, nullptr, /*allow_exceptions=*/false);
  const json model = experiment.is_object() ? experiment.value("model", json()) : json();
  if (!model.is_object() || model.value("name", "") != "mlp" || !model.contains("layers") ||
      !model["layers"].is_array() || model["layers"].size() < 2) {
    throw BenchError(fmt::format("--faults slow-timeout: {} is not an mlp experiment with model.layers; it widens the "
                                 "MLP's hidden layer so that its gradients outlast the timeout",
                                 o.experiment));
  }
  const int64_t inputs = model["layers"].front().get<int64_t>(), outputs = model["layers"].back().get<int64_t>();
  const double bytesPerSecond = linkProfile(o.slowLink).gbitPerSecond * 1e9 / 8;
  const int world = layout.worldSize();
  const double needBytes = 3 * o.timeoutS * bytesPerSecond * world / (2.0 * (world - 1));
  // (inputs + 1 + outputs) weights and biases per hidden unit, 4 bytes each.
  const int64_t hidden = static_cast<int64_t>(std::ceil(needBytes / 4 / static_cast<double>(inputs + 1 + outputs)));
  return fmt::format("model.layers=[{},{},{}]", inputs, hidden, outputs);
}

// One job of H launchers with `fault`; returns when all have exited.
Job runJob(const Options& o, const SimCluster& cluster, const HostLayout& layout, const ServiceEtcd& etcd,
           const std::string& workDir, const std::string& fault, bool restart) {
  Job job;
  job.fault = fault;
  job.restart = restart;
  job.dir = workDir + "/" + fault + (restart ? "-restart" : "");
  const int last = layout.hosts - 1;
  const int lastRank = last * layout.ranksPerHost;  // the last host's first rank
  if (fault == "host" || fault == "collective" || fault == "link" || fault == "replace") job.victims = {last};
  if (fault == "recovery") job.victims = {last, last - 1};
  // On 2 hosts, slow-timeout stops the job: nobody survives it, or is its victim.
  if (fault == "slow-timeout" && layout.hosts >= 3) job.victims = {last};
  const std::string id = fmt::format("faults-{}{}-{}-{}", fault, restart ? "-restart" : "", ::getpid(),
                                     static_cast<long long>(wallNow()));
  if (fault == "slow") {
    cluster.reshape(last, linkProfile(o.slowLink));
    job.faultTime = wallNow();
  }
  std::vector<SpawnOptions> specs;
  std::vector<std::vector<std::string>> launchers;  // each host's command, before its wrapping
  for (int h = 0; h < layout.hosts; ++h) {
    std::vector<std::string> argv = {ddpRunPath(), "--nnodes", std::to_string(layout.hosts), "--node-rank",
                                     std::to_string(h), "--nproc-per-node", std::to_string(layout.ranksPerHost),
                                     "--rdzv-backend", "etcd", "--rdzv-endpoint", etcd.endpoint(), "--rdzv-id", id,
                                     "--min-ranks", std::to_string(restart ? 0 : o.minRanks),
                                     "--max-restarts", std::to_string(restart ? o.restarts : 0),
                                     o.experiment, "--out", job.dir, "--set", "training.log_every=1",
                                     // A restart continues from the newest checkpoint: one each epoch.
                                     "--set", fmt::format("training.save_every={}", restart ? 1 : 0),
                                     "--set", fmt::format("distributed.timeout_s={}", o.timeoutS)};
    if (o.epochs > 0) argv.insert(argv.end(), {"--set", fmt::format("training.epochs={}", o.epochs)});
    for (const std::string& set : o.overrides) argv.insert(argv.end(), {"--set", set});
    if (fault == "slow-timeout") {
      // Its model is wide, its steps slower: 20 epochs at most.
      argv.insert(argv.end(), {"--set", slowTimeoutLayers(o, layout)});
      if (o.epochs > 20) argv.insert(argv.end(), {"--set", "training.epochs=20"});
    }
    // setsid: the launcher leads a session, its host's, for DDP_FAULT_INJECT :host.
    argv.insert(argv.begin(), "/usr/bin/setsid");
    launchers.push_back(argv);
    SpawnOptions options;
    options.argv = cluster.wrap(h, loggedTo(fmt::format("{}.host{}.log", job.dir, h), argv));
    options.program = options.argv[0];
    EnvMap env = currentEnvironment();
    for (const char* name : {"DDP_FAULT_INJECT", "DDP_FAULT_RECOVERY", "MASTER_ADDR", "MASTER_PORT", "RANK",
                             "WORLD_SIZE", "LOCAL_RANK"}) {
      env.erase(name);
    }
    env["DDP_STORE_TOKEN"] = id;
    if (fault == "collective" && h == last) {
      env["DDP_FAULT_INJECT"] = fmt::format("{}@{}:delay={}:host", lastRank, o.atStep, kCollectiveDelayMs);
    }
    if (fault == "recovery" && h == last - 1) {
      env["DDP_FAULT_RECOVERY"] = fmt::format("{}:host", (last - 1) * layout.ranksPerHost);
    }
    if (fault == "replace") {
      env["DDP_FAULT_SLOW"] = "0:30";
      env["DDP_FAULT_AWAIT_JOIN"] = std::to_string(o.atStep + 10);
    } else if (fault == "host" || fault == "link" || fault == "recovery") {
      // Steps of 20 ms at least: ddp-bench acts on the step's record, and
      // on a busy machine its loop may fall seconds behind the job.
      env["DDP_FAULT_SLOW"] = "0:20";
    }
    options.environment = std::move(env);
    options.dieWithParent = true;
    specs.push_back(options);
    job.pids.push_back(spawnProcess(options).pid);
  }
  pid_t replacement = -1;
  bool replaced = fault != "replace";
  job.exitCodes.assign(layout.hosts, -1);
  const int timeLimit = jobTimeLimit(o, restart);
  const auto deadline = Clock::now() + std::chrono::seconds(timeLimit);
  const std::string stepsPath = job.dir + "/steps.jsonl";
  // slow: from the start (step --at-step would come late on a busy machine,
  // where this loop runs behind the job's short epochs).
  bool injected = fault == "none" || fault == "collective" || fault == "slow";
  bool linkDown = false;
  Clock::time_point linkUpAt;
  int remaining = layout.hosts;
  auto killAll = [&] {
    for (int h = 0; h < layout.hosts; ++h) cluster.killHost(h);
    if (linkDown) cluster.setLink(last, true);
    if (fault == "slow" || fault == "slow-timeout") cluster.reshape(last, cluster.link());
    std::vector<pid_t> left;
    for (int h = 0; h < layout.hosts; ++h) {
      if (job.exitCodes[h] < 0) left.push_back(job.pids[h]);
    }
    if (replacement > 0 && job.replacementExit < 0) left.push_back(replacement);
    for (pid_t pid : left) ::kill(pid, SIGKILL);
    const auto until = Clock::now() + std::chrono::seconds(10);
    for (pid_t pid : left) {
      while (::waitpid(pid, nullptr, WNOHANG) == 0 && Clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
  };
  while (remaining > 0) {
    for (int h = 0; h < layout.hosts; ++h) {
      int status = 0;
      if (job.exitCodes[h] >= 0 || ::waitpid(job.pids[h], &status, WNOHANG) <= 0) continue;
      job.exitCodes[h] = exitCode(status);
      job.endTime = wallNow();
      --remaining;
    }
    if (!injected) {
      const std::vector<json> records = readRecords(stepsPath);
      if (!records.empty() && records.back().value("step", int64_t{0}) >= o.atStep) {
        injected = true;
        // The fault's time: once it is done (a step that completes while
        // ip works is not one after it).
        if (fault == "slow" || fault == "slow-timeout") {
          cluster.reshape(last, linkProfile(o.slowLink));
        } else if (fault == "link") {
          cluster.setLink(last, false);
          linkDown = true;
          linkUpAt = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(linkCutSeconds(o) * 1000));
        } else {
          cluster.killHost(last);
        }
        job.faultTime = wallNow();
      }
    }
    if (injected && !replaced) {
      // The others train on at the smaller world: the replacement starts.
      const std::vector<json> records = readRecords(stepsPath);
      if (!records.empty() && records.back().value("world_size", 0) < layout.worldSize()) {
        replaced = true;
        SpawnOptions again = specs[last];
        again.argv = cluster.wrap(last, loggedTo(fmt::format("{}.host{}.replacement.log", job.dir, last), launchers[last]));
        again.program = again.argv[0];
        replacement = spawnProcess(again).pid;
        job.replacedTime = wallNow();
        ++remaining;
      }
    }
    if (replacement > 0 && job.replacementExit < 0) {
      int status = 0;
      if (::waitpid(replacement, &status, WNOHANG) > 0) {
        job.replacementExit = exitCode(status);
        --remaining;
      }
    }
    if (linkDown && Clock::now() >= linkUpAt) {
      cluster.setLink(last, true);
      linkDown = false;
    }
    if (const int sig = stopSignal()) {
      killAll();
      throw BenchError(fmt::format("stopped by signal {} during the {} run", sig, fault));
    }
    if (Clock::now() > deadline) {
      killAll();
      throw BenchError(fmt::format("the {} run did not end within {} s (logs: {}.host*.log)", fault, timeLimit,
                                   job.dir));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (linkDown) cluster.setLink(last, true);  // every launcher ended while it was cut: the next job needs it
  if (fault == "slow" || fault == "slow-timeout") cluster.reshape(last, cluster.link());
  if (!injected) {
    throw BenchError(fmt::format("the {} run ended before step {} was recorded: raise training.epochs or lower --at-step",
                                 fault, o.atStep));
  }
  if (fault == "collective") {
    // The victim acted kCollectiveDelayMs after its step; that step's record is the clock.
    for (const json& r : readRecords(stepsPath)) {
      if (r.value("step", int64_t{0}) == o.atStep) job.faultTime = r.at("time").get<double>() + kCollectiveDelayMs / 1000.0;
    }
  }
  return job;
}

// The record of one job, and whether its checks passed (failures printed).
json summarize(const Options& o, const HostLayout& layout, const Job& job, const json& reference, bool& ok,
               const std::function<std::string(int)>& hostName) {
  const std::vector<json> steps = readRecords(job.dir + "/steps.jsonl");
  const std::vector<json> metrics = readRecords(job.dir + "/metrics.jsonl");
  json r = {{"fault", job.fault}, {"hosts", o.hosts}, {"link", o.link}, {"timeout_s", o.timeoutS},
            {"min_ranks", o.minRanks}, {"fault_step", job.fault == "none" ? 0 : o.atStep}};
  std::vector<int64_t> numbers;
  for (const json& s : steps) numbers.push_back(s.value("step", int64_t{0}));
  std::set<int64_t> unique(numbers.begin(), numbers.end());
  bool once = !numbers.empty();
  for (size_t i = 0; i < numbers.size(); ++i) once = once && numbers[i] == static_cast<int64_t>(i + 1);
  r["steps"] = numbers.size();
  r["steps_lost"] = numbers.size() - unique.size();
  r["steps_once"] = once;
  r["final_world"] = steps.empty() ? 0 : steps.back().value("world_size", 0);
  r["test_accuracy"] = metrics.empty() ? json(nullptr) : metrics.back().value("test_accuracy", json(nullptr));
  int worst = 0;
  json victimCodes = json::array();
  for (int h = 0; h < layout.hosts; ++h) {
    if (job.victims.count(h)) {
      victimCodes.push_back(job.exitCodes[h]);
    } else {
      worst = std::max(worst, job.exitCodes[h]);
    }
  }
  if (job.fault == "replace") {
    worst = std::max(worst, job.replacementExit);
    r["replacement_exit_code"] = job.replacementExit;
    r["rejoined_s"] = nullptr;
    for (const json& s : steps) {
      const double t = s.at("time").get<double>();
      if (t > job.replacedTime && s.value("world_size", 0) == layout.worldSize()) {
        r["rejoined_s"] = t - job.replacedTime;
        break;
      }
    }
  }
  r["exit_code"] = worst;
  r["victim_exit_codes"] = victimCodes;
  r["exit_codes"] = job.exitCodes;
  r["recovery"] = job.restart ? "restart" : "in-place";
  if (job.restart) {
    // Every rank started again from the newest checkpoint (one per epoch):
    // recovered at the first step a restarted rank completed; the steps
    // since that checkpoint were done twice (steps_lost). Measured, not
    // checked: a host that is gone for good ends such a job.
    r["recovered_s"] = nullptr;
    for (const json& s : steps) {
      if (s.value("restart", int64_t{0}) > 0 && s.at("time").get<double>() > job.faultTime) {
        r["recovered_s"] = s.at("time").get<double>() - job.faultTime;
        break;
      }
    }
    // The restarts the launchers made (the most of any host's), whether or
    // not a restarted rank ever got to a step.
    int restarts = 0;
    for (int h = 0; h < layout.hosts; ++h) {
      const std::string text = readText(fmt::format("{}.host{}.log", job.dir, h));
      int made = 0;
      for (size_t at = 0; (at = text.find("ddp-run: restarting all ranks", at)) != std::string::npos; ++at) ++made;
      restarts = std::max(restarts, made);
    }
    r["restarts"] = restarts;
    const int64_t unfailedSteps = reference.value("steps", int64_t{0});
    const bool complete = unfailedSteps > 0 && static_cast<int64_t>(unique.size()) == unfailedSteps &&
                          *unique.begin() == 1 && *unique.rbegin() == unfailedSteps;
    r["outcome"] = worst == 0 && complete && r["recovered_s"].is_number() ? "recovered" : "ended";
    // How long the others went on trying before the job ended.
    if (r["outcome"] == "ended") r["ended_s"] = job.endTime - job.faultTime;
    return r;
  }
  // The first step completed after the fault is the first at the smaller
  // world: a step whose collective had the victims' part before they died
  // may still be recorded just after the fault.
  r["recovered_s"] = nullptr;
  if (job.fault != "none" && !steps.empty()) {
    const int before = steps.front().value("world_size", 0);
    for (const json& s : steps) {
      const double t = s.at("time").get<double>();
      if (t > job.faultTime && s.value("world_size", 0) < before) {
        r["recovered_s"] = t - job.faultTime;
        break;
      }
    }
  }
  // The trainer's own figure, from its log line "... recovered in 0.115 s",
  // and what told the survivors to go on without the victims (elastic.cpp's
  // lines): their heartbeat stood still, they were seen dying, or the
  // whole settle time passed.
  const std::string line = lastLineWith(readText(job.dir + ".host0.log"), "recovered in ");
  // (Whoever arrived first at the rendezvous decided it: any survivor.)
  std::string survivorLog;
  for (int h = 0; h < layout.hosts; ++h) {
    if (!job.victims.count(h)) survivorLog += readText(fmt::format("{}.host{}.log", job.dir, h));
  }
  if (!job.victims.empty()) {
    r["decided_by"] = !lastLineWith(survivorLog, "the probe of the links between hosts found").empty() ? "probe"
                      : !lastLineWith(survivorLog, "stood still for").empty()            ? "heartbeat"
                      : !lastLineWith(survivorLog, "neither arrived nor died within").empty() ? "settle"
                                                                                            : "death";
  }
  r["reported_s"] = nullptr;
  if (!line.empty()) r["reported_s"] = std::atof(line.c_str() + line.find("recovered in ") + 13);
  const bool slowFault = job.fault == "slow" || job.fault == "slow-timeout";
  auto median = [](std::vector<double> v) -> json {
    if (v.empty()) return nullptr;
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  };
  if (job.fault == "none") {
    std::vector<double> all;
    for (const json& s : steps) {
      if (s.value("step_ms", json()).is_number()) all.push_back(s["step_ms"].get<double>());
    }
    if (!all.empty()) r["step_ms_median"] = median(all);
  }
  if (slowFault) {
    // Step times at the full world, before and after the link slowed (medians).
    std::vector<double> before, after;
    for (const json& s : steps) {
      if (!s.value("step_ms", json()).is_number() || s.value("world_size", 0) != layout.worldSize()) continue;
      (s.at("time").get<double>() < job.faultTime ? before : after).push_back(s["step_ms"].get<double>());
    }
    r["slow_link"] = o.slowLink;
    // slow is slow from the start: "before" is the unfailed run's.
    r["step_ms_before"] = job.fault == "slow" ? reference.value("step_ms_median", json()) : median(before);
    r["step_ms_slowed"] = median(after);
    r["straggler_line"] = lastLineWith(readText(job.dir + "/train.log"), "straggler: host");
  }
  if (job.fault == "link" || job.fault == "slow-timeout") {
    if (job.fault == "link") r["cut_s"] = linkCutSeconds(o);
    std::string word = lastLineWith(readText(fmt::format("{}.host{}.log", job.dir, layout.hosts - 1)), "left out");
    r["victim_line"] = word;
  }
  auto check = [&](bool condition, const std::string& what) {
    if (!condition) {
      std::cout << fmt::format("FAILED: {}: {}\n", job.fault, what);
      ok = false;
    }
  };
  // slow-timeout on 2 hosts: the probe cannot tell whose link it is; after
  // 3 timeouts at one step the job stops with a checkpoint, every launcher
  // non-zero.
  const bool stops = job.fault == "slow-timeout" && layout.hosts < 3;
  if (stops) {
    // The member with the state says what it saved; the others say why they stop.
    r["stopped_line"] = "";
    for (int h = 0; h < layout.hosts; ++h) {
      const std::string line =
          lastLineWith(readText(fmt::format("{}.host{}.log", job.dir, h)), "times in a row with every rank alive");
      if (r["stopped_line"].get<std::string>().empty() || line.find("saved ") != std::string::npos) {
        r["stopped_line"] = line;
      }
    }
    r["outcome"] = "stopped";
    check(std::all_of(job.exitCodes.begin(), job.exitCodes.end(), [](int c) { return c != 0; }),
          fmt::format("slow-timeout on {} hosts: a launcher exited 0 ({})", layout.hosts, r["exit_codes"].dump()));
    check(r["stopped_line"].get<std::string>().find("saved ") != std::string::npos,
          "slow-timeout on 2 hosts: no line saying the job stopped after repeated timeouts, with a checkpoint");
    check(once, fmt::format("steps are not 1..N each once: {}", fmt::join(numbers, ",")));
    return r;
  }
  if (slowFault) r["outcome"] = r["final_world"] == layout.worldSize() ? "kept" : "left out";
  check(worst == 0, fmt::format("a surviving launcher exited {} (logs: {}.host*.log)", worst, job.dir));
  check(once, fmt::format("steps are not 1..N each once: {}", fmt::join(numbers, ",")));
  // (slow-timeout trains a wider model than the reference.)
  if (job.fault != "none" && job.fault != "slow-timeout" && reference.contains("test_accuracy") &&
      reference["test_accuracy"].is_number() && r["test_accuracy"].is_number()) {
    const double delta = r["test_accuracy"].get<double>() - reference["test_accuracy"].get<double>();
    r["accuracy_delta"] = delta;
    check(std::abs(delta) <= o.tolerance, fmt::format("test accuracy {:.4f} is not within {} of the unfailed {:.4f}",
                                                      r["test_accuracy"].get<double>(), o.tolerance,
                                                      reference["test_accuracy"].get<double>()));
  }
  if (job.fault != "none") {
    const int expected = job.fault == "replace"
                             ? layout.worldSize()
                             : layout.worldSize() - static_cast<int>(job.victims.size()) * layout.ranksPerHost;
    check(r["final_world"] == expected, fmt::format("final world {} (expected {})", r["final_world"].dump(), expected));
    if (job.fault != "slow") check(r["recovered_s"].is_number(), "no step completed after the fault");
    for (int code : victimCodes) check(code != 0, "a victim host's launcher exited 0");
  }
  if (job.fault == "replace") check(r["rejoined_s"].is_number(), "no step at the full world after the replacement started");
  if (job.fault == "link" || job.fault == "slow-timeout") {
    check(!r["victim_line"].get<std::string>().empty(),
          fmt::format("the {} host's log has no line saying its ranks were left out",
                      job.fault == "link" ? "cut" : "slow"));
  }
  if (job.fault == "slow") {
    // The slow host, by its name (the netns's) and its ranks, in the straggler report.
    const std::string line = r["straggler_line"].get<std::string>();
    const int last = layout.hosts - 1;
    std::vector<int> ranks;
    for (int k = 0; k < layout.ranksPerHost; ++k) ranks.push_back(last * layout.ranksPerHost + k);
    const std::string named = fmt::format("host {} (rank{} {})", hostName(last), ranks.size() == 1 ? "" : "s",
                                          fmt::join(ranks, ","));
    r["named"] = line.find(named) != std::string::npos;
    check(r["named"].get<bool>(), fmt::format("the straggler report does not name {}: \"{}\"", named, line));
  }
  return r;
}

void runFaults(const Options& o) {
  checkOutputPaths(o.jsonPath, "");
  static const std::set<std::string> known = {"host",    "collective", "link", "recovery",
                                              "replace", "slow",       "slow-timeout"};
  for (const std::string& f : o.faults) {
    if (!known.count(f)) {
      throw BenchError(fmt::format(
          "--faults {}: unknown fault (known: host, collective, link, recovery, replace, slow, slow-timeout)", f));
    }
  }
  for (const std::string& f : o.restartFaults) {
    if (f != "host" && f != "collective" && f != "link") {
      throw BenchError(fmt::format("--restart-faults {}: not one a restart meets (known: host, collective, link)", f));
    }
  }
  linkProfile(o.slowLink);  // a bad --slow-link fails here, before any cluster is made
  HostLayout layout = parseHostLayout(o.hosts);
  const bool twoLost = std::count(o.faults.begin(), o.faults.end(), "recovery") > 0;
  // (The straggler report blames one host's two links: a third host is the
  // measure. slow-timeout on 2 hosts shows the job stopping instead.)
  const bool blame = std::count(o.faults.begin(), o.faults.end(), "slow") > 0;
  const int needHosts = twoLost || blame ? 3 : 2;
  if (layout.hosts < needHosts) {
    throw BenchError(fmt::format("--hosts {}: the faults asked for need {} hosts or more", o.hosts, needHosts));
  }
  const int lost = (twoLost ? 2 : 1) * layout.ranksPerHost;
  if (o.minRanks < 1 || o.minRanks > layout.worldSize() - lost) {
    throw BenchError(fmt::format("--min-ranks {}: must be 1..{} so that the job survives losing {} rank(s)",
                                 o.minRanks, layout.worldSize() - lost, lost));
  }
  for (const char* tool : {"/usr/bin/etcd", "/usr/bin/etcdctl"}) {
    if (::access(tool, X_OK) != 0) {
      std::cout << "SKIPPED: " << tool
                << " is not installed (Debian's etcd-server and etcd-client; scripts/setup.sh installs them)\n";
      return;
    }
  }
  std::unique_ptr<SimCluster> cluster = clusterFromOptions(o.hosts, o.link, layout, std::cout);
  if (!cluster) return;  // SKIPPED, printed
  std::optional<TempDir> scratch;
  std::string work = o.keepDir;
  if (work.empty()) {
    scratch.emplace("ddp-bench-faults-");
    work = scratch->path();
  } else {
    std::filesystem::create_directories(work);
    work = std::filesystem::canonical(work).string();
  }
  ServiceEtcd etcd(*cluster, work);
  std::cout << fmt::format("# store: etcd on the service node {}; faults on the last host(s); timeout_s {}\n",
                           etcd.endpoint(), o.timeoutS);
  bool ok = true;
  json records = json::array();
  // (fault, under --max-restarts): the unfailed run, each fault in place,
  // then with --restarts the faults a restart can meet, restarted.
  std::vector<std::pair<std::string, bool>> order = {{"none", false}};
  for (const std::string& f : o.faults) order.emplace_back(f, false);
  if (o.restarts > 0) {
    for (const std::string& f : o.restartFaults) order.emplace_back(f, true);
  }
  json reference;
  Table table({"fault", "mode", "recovered_s", "reported_s", "rejoined_s", "steps", "lost", "once", "world", "test_acc", "exit",
               "victims"});
  for (const auto& [fault, restart] : order) {
    std::cerr << "ddp-bench faults: " << fault << (restart ? fmt::format(" (--max-restarts {})", o.restarts) : "")
              << "\n";
    const Job job = runJob(o, *cluster, layout, etcd, work, fault, restart);
    json r = summarize(o, layout, job, reference, ok, [&](int h) { return cluster->netns(h); });
    if (fault == "none") reference = r;
    auto number = [](const json& v, int digits) { return v.is_number() ? formatFixed(v.get<double>(), digits) : "-"; };
    table.addRow({fault, restart ? "restart" : "in place", number(r["recovered_s"], 3), number(r["reported_s"], 3), number(r.value("rejoined_s", json()), 3),
                  std::to_string(r["steps"].get<int>()),
                  std::to_string(r["steps_lost"].get<int>()), r["steps_once"].get<bool>() ? "yes" : "NO",
                  std::to_string(r["final_world"].get<int>()), number(r["test_accuracy"], 4),
                  std::to_string(r["exit_code"].get<int>()), r["victim_exit_codes"].dump()});
    records.push_back(std::move(r));
  }
  std::cout << table.render();
  for (const json& r : records) {
    if (r.contains("victim_line") && !r["victim_line"].get<std::string>().empty()) {
      std::cout << fmt::format("{}: the {} host said: {}\n", r["fault"].get<std::string>(), r["fault"] == "link" ? "cut" : "slow",
                               r["victim_line"].get<std::string>());
    }
  }
  for (const json& r : records) {
    if (r["recovery"] != "restart") continue;
    const std::string fault = r["fault"].get<std::string>();
    if (r["outcome"] == "recovered") {
      std::cout << fmt::format("{} under --max-restarts {}: recovered in {:.3f} s, {} step(s) done again from the "
                               "newest checkpoint\n",
                               fault, o.restarts, r["recovered_s"].get<double>(), r["steps_lost"].get<int>());
    } else {
      // A host that never comes back is why for host and collective; a
      // link that did come back should have been recovered from.
      std::cout << fmt::format("{} under --max-restarts {}: the job ended {:.1f} s after the fault (exit {}, {} "
                               "restart(s)){}\n",
                               fault, o.restarts, r.value("ended_s", 0.0), r["exit_code"].get<int>(),
                               r["restarts"].get<int>(),
                               fault == "link" ? fmt::format(" although the link came back: see {}.host*.log", work + "/link-restart")
                                               : ": the host never came back, and a restart needs every host");
    }
  }
  writeRecords(o.jsonPath, "", records);
  if (!ok) throw BenchError("a fault was not survived as it should be (FAILED lines above)");
}

}  // namespace faults

void registerFaultsCommand(CLI::App& app) {
  using namespace faults;
  auto options = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "faults", "Kill hosts and cut links of a simulated cluster under a job that recovers in place; time each recovery");
  cmd->add_option("--hosts", options->hosts, "HOSTSxRANKS of the simulated cluster")->capture_default_str();
  cmd->add_option("--link", options->link, "its links: 10gbit, 1gbit or none")->capture_default_str();
  cmd->add_option("--faults", options->faults, "host, collective, link, recovery, replace, slow, slow-timeout")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--experiment", options->experiment, "the job")->capture_default_str();
  cmd->add_option("--slow-link", options->slowLink, "the slow faults' link for the last host: 10mbit, 1gbit, ...")
      ->capture_default_str();
  cmd->add_option("--set", options->overrides, "override a setting of the experiment (repeatable)");
  cmd->add_option("--epochs", options->epochs, "training.epochs of each job (0: the experiment's)")
      ->capture_default_str();
  cmd->add_option("--at-step", options->atStep, "the fault comes after this optimizer step")->capture_default_str();
  cmd->add_option("--min-ranks", options->minRanks, "ddp-run --min-ranks")->capture_default_str();
  cmd->add_option("--timeout-s", options->timeoutS, "distributed.timeout_s: how long a silent host is waited for")
      ->capture_default_str();
  cmd->add_option("--tolerance", options->tolerance, "final test accuracy allowed from the unfailed run's")
      ->capture_default_str();
  cmd->add_option("--time-limit", options->timeLimitS,
                  "seconds one job may take (a restart job: plus 70 s per restart, to wait for a lost host)")
      ->capture_default_str();
  cmd->add_option("--cut-s", options->cutS, "link: seconds the link stays down (0: distributed.timeout_s + 3)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--restarts", options->restarts,
                  "also run host, collective and link under ddp-run --max-restarts N (no --min-ranks; a checkpoint "
                  "each epoch), to compare with recovery in place (0: not)")
      ->check(CLI::Range(0, 100))
      ->capture_default_str();
  cmd->add_option("--restart-faults", options->restartFaults, "the faults run again under --restarts")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--keep", options->keepDir, "keep the jobs' run folders and launcher logs in this folder");
  cmd->add_option("--json", options->jsonPath, "Also write the records to this JSON file");
  cmd->callback([options] {
    try {
      runFaults(*options);
    } catch (const std::exception& e) {
      std::cerr << "ddp-bench faults: error: " << e.what() << "\n";
      throw CLI::RuntimeError(1);
    }
  });
}

}  // namespace ddp::bench
