// `ddp-bench collectives`: per-op time and bandwidth of the collectives
// (and of send/recv) of each CPU backend, against LibTorch's c10d
// ProcessGroupGloo, over a sweep of message sizes.
//
// The launcher (this command without worker flags) runs, for one
// implementation after the other, `world-size` worker processes (this
// executable again, with hidden --worker-* flags). Implementations never
// run at the same time, so they do not compete for the cores. Rank 0 of
// each implementation writes its measurements to a JSON file in a private
// directory, which the launcher reads to print the table and ratios.
//
// Bandwidths follow nccl-tests: algbw = bytes / time, and busbw scales it by
// the fraction of the data each rank must send, so that busbw is comparable
// across operations and world sizes (allreduce 2(n-1)/n, allgather and
// reduce_scatter, alltoall, gather and scatter (n-1)/n, broadcast and
// sendrecv 1). For allgather, reduce_scatter, gather and scatter, `bytes` is
// the total (world x per-rank) size; for alltoall, what each rank sends
// (itself included). sendrecv is a ping-pong between rank 0 and the last
// rank (on a simulated cluster, across hosts); its time is half a round
// trip, the time of one message, as OSU's latency test reports it.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <thread>

#include "backends/builtin.hpp"
#include "benchmarks/bench_util.hpp"
#include "framework/core/compute_threads.hpp"
#include "framework/core/errors.hpp"
#include "framework/core/system.hpp"
#include "benchmarks/collective_impls.hpp"
#include "benchmarks/commands.hpp"
#include "framework/comm/backend_registry.hpp"
#include "framework/store/tcp_store.hpp"

namespace ddp::bench {
// The command's own names, in a namespace of their own (not an unnamed one,
// which unity batches would merge with the other commands').
namespace collectives {

using nlohmann::json;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr int64_t kElementSize = sizeof(float);
constexpr int64_t kLargeMessage = int64_t{16} << 20;  // from here on, fewer iterations

// Backends that need devices this benchmark does not use (it sweeps CPU
// tensors), with the reason printed when they are skipped.
const std::map<std::string, std::string> kSkippedBackends = {
    {"nccl", "needs CUDA tensors; this benchmark sweeps CPU tensors"},
};

struct Options {
  int worldSize = 2;
  std::string minBytes = "4K";
  std::string maxBytes = "64M";
  int sizeFactor = 4;
  std::vector<std::string> ops = {"allreduce", "allgather", "broadcast", "reduce_scatter",
                                  "alltoall",  "gather",    "scatter",   "sendrecv"};
  std::vector<std::string> impls;  // empty: every CPU backend and c10d-gloo
  int warmup = 5;
  int iters = 20;
  bool verify = false;
  std::string jsonPath;
  std::string plotPath;
  int timeoutSeconds = 900;      // per implementation, all ranks together
  int collectiveTimeoutSeconds = 120;
  std::string hosts;        // "HxR": ranks in a simulated cluster (sim_cluster.hpp)
  std::string link = "1gbit";

  // Hidden: set by the launcher for the processes it starts.
  int workerRank = -1;
  std::string workerImpl;
  std::string workerDir;
};

// ---- the sweep's points ---------------------------------------------------------

// One (operation, size) of the sweep, in elements per tensor.
struct Point {
  CollectiveOp op;
  int64_t bytes = 0;  // what the table reports (the total for allgather, gather, ...)
  int64_t inputNumel = 0;
  int64_t outputNumel = 0;  // 0: the operation works in place
};

// The requested size, rounded down so that it splits evenly into float32
// elements (and into ranks where the operation splits it).
std::optional<Point> planPoint(CollectiveOp op, int64_t requestedBytes, int worldSize) {
  const int64_t elements = requestedBytes / kElementSize;
  Point p{op};
  switch (op) {
    case CollectiveOp::Allreduce:
    case CollectiveOp::Broadcast:
      p.inputNumel = elements;
      break;
    case CollectiveOp::Allgather:
    case CollectiveOp::Gather:
      p.inputNumel = elements / worldSize;
      p.outputNumel = p.inputNumel * worldSize;
      break;
    case CollectiveOp::ReduceScatter:
    case CollectiveOp::Scatter:
      p.outputNumel = elements / worldSize;
      p.inputNumel = p.outputNumel * worldSize;
      break;
    case CollectiveOp::Alltoall:
      p.inputNumel = elements / worldSize * worldSize;
      p.outputNumel = p.inputNumel;
      break;
    case CollectiveOp::SendRecv:
      p.inputNumel = elements;
      p.outputNumel = elements;
      break;
  }
  if (p.inputNumel == 0) return std::nullopt;  // (then the output is empty too)
  p.bytes = std::max(p.inputNumel, p.outputNumel) * kElementSize;
  return p;
}

double busBandwidthFactor(CollectiveOp op, int worldSize) {
  const double n = worldSize;
  switch (op) {
    case CollectiveOp::Allreduce: return 2 * (n - 1) / n;
    case CollectiveOp::Allgather:
    case CollectiveOp::ReduceScatter:
    case CollectiveOp::Alltoall:
    case CollectiveOp::Gather:
    case CollectiveOp::Scatter: return (n - 1) / n;
    case CollectiveOp::Broadcast:
    case CollectiveOp::SendRecv: return 1;
  }
  return 1;
}

int timedIterations(const Options& o, int64_t bytes) {
  // Large messages take long and vary little: half the iterations, but
  // never fewer than 5 (unless fewer were asked for).
  if (bytes >= kLargeMessage) return std::max(std::min(o.iters, 5), o.iters / 2);
  return o.iters;
}

// ---- data and its check -----------------------------------------------------------

// Rank r's inputs hold (r+1)*1000 + (global index mod 1000). The values and
// their sums over ranks are integers below 2^24 (for up to ~180 ranks), so
// float32 holds them exactly and results compare exactly; the index term
// catches data that lands at the wrong offset.
at::Tensor indexTerm(int64_t numel, int64_t firstIndex) {
  return torch::arange(firstIndex, firstIndex + numel, torch::kLong).remainder(1000).to(torch::kFloat);
}

at::Tensor rankPattern(int64_t numel, int rank) { return indexTerm(numel, 0) + (rank + 1) * 1000.0; }

// Undefined where this rank has no result (gather off the root, sendrecv
// between its two ranks).
at::Tensor expectedResult(const Point& p, int rank, int worldSize) {
  const double rankSum = 1000.0 * worldSize * (worldSize + 1) / 2;  // sum over ranks of (r+1)*1000
  switch (p.op) {
    case CollectiveOp::Allreduce: return indexTerm(p.inputNumel, 0) * worldSize + rankSum;
    case CollectiveOp::Broadcast: return rankPattern(p.inputNumel, 0);
    case CollectiveOp::Allgather: {
      std::vector<at::Tensor> slices;
      for (int r = 0; r < worldSize; ++r) slices.push_back(rankPattern(p.inputNumel, r));
      return torch::cat(slices);
    }
    case CollectiveOp::ReduceScatter:
      return indexTerm(p.outputNumel, rank * p.outputNumel) * worldSize + rankSum;
    case CollectiveOp::Alltoall: {  // block i: rank i's block `rank`
      const int64_t block = p.inputNumel / worldSize;
      std::vector<at::Tensor> blocks;
      for (int i = 0; i < worldSize; ++i) blocks.push_back(indexTerm(block, rank * block) + (i + 1) * 1000.0);
      return torch::cat(blocks);
    }
    case CollectiveOp::Gather: {
      if (rank != 0) return {};
      std::vector<at::Tensor> slices;
      for (int r = 0; r < worldSize; ++r) slices.push_back(rankPattern(p.inputNumel, r));
      return torch::cat(slices);
    }
    case CollectiveOp::Scatter: return indexTerm(p.outputNumel, rank * p.outputNumel) + 1000.0;
    case CollectiveOp::SendRecv:  // rank 0's input, there and back
      return rank == 0 || rank == worldSize - 1 ? rankPattern(p.inputNumel, 0) : at::Tensor();
  }
  return {};
}

void verifyResult(const std::string& impl, const Point& p, const Buffers& buffers, int rank, int worldSize) {
  const bool inPlace = p.op == CollectiveOp::Allreduce || p.op == CollectiveOp::Broadcast;
  const at::Tensor& actual = inPlace ? buffers.input : buffers.output;
  const at::Tensor expected = expectedResult(p, rank, worldSize);
  if (!expected.defined() || torch::equal(actual, expected)) return;
  const int64_t index = torch::ne(actual, expected).nonzero()[0][0].item<int64_t>();
  fail<BenchError>("verification failed: {} {} {} bytes (world size {}, rank {}): element {} is {}, expected {}", impl,
                   opName(p.op), p.bytes, worldSize, rank, index, actual[index].item<float>(),
                   expected[index].item<float>());
}

// Fills the buffers with this rank's pattern (and zeroes the output).
void fillInputs(const Point& p, Buffers& buffers, int rank) {
  buffers.input.copy_(rankPattern(p.inputNumel, rank));
  if (buffers.output.defined()) buffers.output.zero_();
}

// ---- worker: one rank of one implementation -------------------------------------

std::string resultsPath(const std::string& dir, const std::string& impl) {
  return dir + "/results." + impl + ".json";
}

// nccl-tests' columns for one point: elements of the message, the reduce
// operation ("none" where there is none) and the root (-1: none).
int64_t pointCount(const Point& p) { return p.bytes / static_cast<int64_t>(sizeof(float)); }
const char* pointRedop(const Point& p) {
  return p.op == CollectiveOp::Allreduce || p.op == CollectiveOp::ReduceScatter ? "sum" : "none";
}
int pointRoot(const Point& p) {
  return p.op == CollectiveOp::Broadcast || p.op == CollectiveOp::Gather || p.op == CollectiveOp::Scatter ? 0 : -1;
}

// Messages per timed call: sendrecv's round trip is two, and its time is
// reported per message.
int messagesPerCall(CollectiveOp op) { return op == CollectiveOp::SendRecv ? 2 : 1; }

json measurementRecord(const std::string& impl, const Point& p, int worldSize, int iters, double seconds,
                       bool verified) {
  const bool supported = !std::isnan(seconds);
  const double algbw = p.bytes / seconds / 1e9;
  auto number = [&](double v) { return supported ? json(v) : json(nullptr); };
  return json{{"impl", impl},
              {"op", opName(p.op)},
              {"world_size", worldSize},
              {"bytes", p.bytes},
              {"count", pointCount(p)},
              {"dtype", "float32"},
              {"redop", pointRedop(p)},
              {"root", pointRoot(p)},
              // Verified results that differ fail the run (verifyResult), so
              // a verified record has none; null: not checked.
              {"wrong", verified && supported ? json(0) : json(nullptr)},
              {"time_us", number(seconds * 1e6)},
              {"algbw_gbps", number(algbw)},
              {"busbw_gbps", number(algbw * busBandwidthFactor(p.op, worldSize))},
              {"supported", supported},
              {"iters", supported ? iters : 0}};
}

// Measures one point: warm-up, then each timed iteration as one call+wait,
// back to back. Returns the median in seconds, NaN when unsupported.
double measurePoint(Communicator& comm, const Options& o, const Point& p, int rank) {
  Buffers buffers;
  buffers.input = torch::empty({p.inputNumel}, torch::kFloat);
  if (p.outputNumel > 0) buffers.output = torch::zeros({p.outputNumel}, torch::kFloat);
  fillInputs(p, buffers, rank);
  // In-place allreduce would multiply the values by the world size on every
  // call; zeros keep them finite (and the cost does not depend on values).
  if (p.op == CollectiveOp::Allreduce) buffers.input.zero_();

  std::function<void()> run = comm.bind(p.op, buffers);
  const int iters = timedIterations(o, p.bytes);
  std::vector<double> seconds;
  // Line up the ranks so that no rank's timing includes another's setup.
  comm.barrier();
  try {
    for (int i = 0; i < o.warmup; ++i) run();
    for (int i = 0; i < iters; ++i) {
      const auto start = std::chrono::steady_clock::now();
      run();
      seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
  } catch (const UnsupportedOp&) {
    return kNaN;  // every rank lands here at the same call
  }

  if (o.verify && comm.computes(p.op)) {
    fillInputs(p, buffers, rank);
    run();
    verifyResult(o.workerImpl, p, buffers, rank, o.worldSize);
  }
  return median(seconds) / messagesPerCall(p.op);
}

void runSweep(Communicator& comm, const Options& o, const std::vector<CollectiveOp>& ops,
              const std::vector<int64_t>& sizes) {
  const int rank = o.workerRank;
  json records = json::array();
  for (CollectiveOp op : ops) {
    for (int64_t requested : sizes) {
      const auto point = planPoint(op, requested, o.worldSize);
      if (!point) continue;  // the launcher tells the user
      const double seconds = measurePoint(comm, o, *point, rank);
      if (rank == 0) {
        const int iters = timedIterations(o, point->bytes);
        records.push_back(
            measurementRecord(o.workerImpl, *point, o.worldSize, iters, seconds, o.verify && comm.computes(op)));
        // Progress, for long sweeps; stdout stays for the launcher's table.
        std::cerr << fmt::format("  {:<10} {:<15} {:>9}  {}\n", o.workerImpl, opName(op), formatBytes(point->bytes),
                                 std::isnan(seconds) ? "not supported" : fmt::format("{:.1f} us", seconds * 1e6));
      }
    }
  }
  // Nobody may tear down the store or its connections while a peer still
  // uses them.
  comm.barrier();
  if (rank == 0) writeJsonFile(resultsPath(o.workerDir, o.workerImpl), records);
}

std::vector<CollectiveOp> parseOps(const std::vector<std::string>& names) {
  std::vector<CollectiveOp> ops;
  for (const auto& name : names) {
    auto op = parseOp(name);
    if (!op) {
      std::vector<std::string> known;
      for (auto k : allOps()) known.push_back(opName(k));
      fail<BenchError>("unknown op '{}' (known: {})", name, joinNames(known));
    }
    ops.push_back(*op);
  }
  if (ops.empty()) throw BenchError("--ops names no operation");
  return ops;
}

std::vector<int64_t> sweepSizes(const Options& o) {
  return geometricSizes(parseByteSize(o.minBytes), parseByteSize(o.maxBytes), o.sizeFactor);
}

int runWorker(const Options& o) {
  std::unique_ptr<Communicator> comm;
  try {
    // Share the cores among the ranks for the work that LibTorch does here
    // (filling, checking), so ranks do not oversubscribe them.
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    setComputeThreads(std::max(1, cores / o.worldSize));

    Rendezvous rendezvous;
    rendezvous.rank = o.workerRank;
    rendezvous.worldSize = o.worldSize;
    rendezvous.portFile = o.workerDir + "/port." + o.workerImpl;
    rendezvous.timeout = std::chrono::seconds(o.collectiveTimeoutSeconds);
    comm = makeCommunicator(o.workerImpl, rendezvous);
    runSweep(*comm, o, parseOps(o.ops), sweepSizes(o));
    comm.reset();
    return 0;
  } catch (const std::exception& e) {
    const std::string message = e.what();
    std::cerr << fmt::format("ddp-bench worker ({} rank {}): {}\n", o.workerImpl, o.workerRank, message);
    reportWorkerError(o.workerDir, o.workerImpl, o.workerRank, message);
    // Exit without destructors: a group whose peer has gone could block in
    // its teardown, and the launcher is waiting for this exit to stop the
    // other ranks.
    std::fflush(stderr);
    std::_Exit(1);
  }
}

// ---- launcher ------------------------------------------------------------------

// The implementations to run, in order: our CPU backends, then c10d-gloo
// (where this build has it).
std::vector<std::string> selectImpls(const Options& o) {
  const auto& registry = builtinBackends();
  std::vector<std::string> all;
  for (const auto& name : registry.names()) {
    auto skip = kSkippedBackends.find(name);
    if (skip != kSkippedBackends.end()) {
      std::cout << fmt::format("# skipping backend '{}': {}\n", name, skip->second);
      continue;
    }
    all.push_back(name);
    if (name == "gloo") all.push_back(kGlooTcp);
  }
  for (const auto& skip : kSkippedBackends) {
    if (!registry.has(skip.first)) {
      std::cout << fmt::format("# skipping backend '{}': not in this build (and {})\n", skip.first, skip.second);
    }
  }
  std::string whyNoC10d;
  if (c10dGlooBuilt(&whyNoC10d)) {
    all.push_back(kC10dGloo);
  } else {
    std::cout << fmt::format("# skipping {}: not in this build: {}\n", kC10dGloo, whyNoC10d);
  }
  if (o.impls.empty()) return all;
  all.push_back(kTcpWire);  // only when asked for

  for (const auto& name : o.impls) {
    if (name == kC10dGloo && !c10dGlooBuilt()) {
      fail<BenchError>("--impls: {} is not in this build: {}", kC10dGloo, whyNoC10d);
    }
    if (std::find(all.begin(), all.end(), name) == all.end()) {
      fail<BenchError>("--impls: '{}' cannot run here; available: {}", name, joinNames(all));
    }
  }
  return o.impls;
}

std::vector<std::string> workerArguments(const Options& o, const std::string& impl, int rank,
                                         const std::string& dir) {
  std::string ops;
  for (const auto& op : o.ops) ops += (ops.empty() ? "" : ",") + op;
  std::vector<std::string> args = {"collectives",
                                   "--world-size", std::to_string(o.worldSize),
                                   "--min-bytes", o.minBytes,
                                   "--max-bytes", o.maxBytes,
                                   "--size-factor", std::to_string(o.sizeFactor),
                                   "--ops", ops,
                                   "--warmup", std::to_string(o.warmup),
                                   "--iters", std::to_string(o.iters),
                                   "--collective-timeout", std::to_string(o.collectiveTimeoutSeconds),
                                   "--worker-rank", std::to_string(rank),
                                   "--worker-impl", impl,
                                   "--worker-dir", dir};
  if (o.verify) args.push_back("--verify");
  return args;
}

double numberOr(const json& value, double fallback) { return value.is_number() ? value.get<double>() : fallback; }

// nccl-tests' table (size in bytes, count, type, redop, root, time,
// algbw, busbw, #wrong), with the implementation and operation in front,
// then each implementation's "Avg bus bandwidth" over the points it ran.
void printTable(const json& records, const std::vector<std::string>& impls) {
  Table table({"impl", "op", "size", "count", "type", "redop", "root", "time_us", "algbw_GB/s", "busbw_GB/s",
               "#wrong"},
              2);
  for (const auto& r : records) {
    table.addRow({r["impl"].get<std::string>(), r["op"].get<std::string>(), std::to_string(r["bytes"].get<int64_t>()),
                  std::to_string(r["count"].get<int64_t>()), "float", r["redop"].get<std::string>(),
                  std::to_string(r["root"].get<int>()), formatFixed(numberOr(r["time_us"], kNaN), 1),
                  formatFixed(numberOr(r["algbw_gbps"], kNaN), 3), formatFixed(numberOr(r["busbw_gbps"], kNaN), 3),
                  r["wrong"].is_null() ? "N/A" : std::to_string(r["wrong"].get<int64_t>())});
  }
  std::cout << table.render();
  for (const auto& impl : impls) {
    double sum = 0;
    int points = 0;
    for (const auto& r : records) {
      if (r["impl"] != impl || !r["supported"].get<bool>()) continue;
      sum += r["busbw_gbps"].get<double>();
      ++points;
    }
    if (points > 0) std::cout << fmt::format("# {:<10} Avg bus bandwidth    : {:.3f} GB/s\n", impl, sum / points);
  }
}

// The record of one (implementation, op, size), or null.
const json* findRecord(const json& records, const std::string& impl, const std::string& op, int64_t bytes) {
  for (const auto& r : records) {
    if (r["impl"] == impl && r["op"] == op && r["bytes"] == bytes) return &r;
  }
  return nullptr;
}

// One line per (implementation, op, size) against `reference`, when it
// ran. busbw ratio > 1 and time ratio < 1 mean the implementation is faster.
void printRatios(const json& records, const std::vector<std::string>& impls, const std::string& reference,
                 const std::string& meaning) {
  if (std::find(impls.begin(), impls.end(), reference) == impls.end()) return;
  bool header = false;
  for (const auto& impl : impls) {
    // The wire is a ceiling, not a contender: it has no line against c10d.
    if (impl == reference || (impl == kTcpWire && reference == kC10dGloo)) continue;
    if (!header) {
      std::cout << "\n# ratios vs " << reference << " (" << meaning << ")\n";
      header = true;
    }
    for (const auto& r : records) {
      if (r["impl"] != impl) continue;
      const std::string op = r["op"];
      const int64_t bytes = r["bytes"];
      const json* base = findRecord(records, reference, op, bytes);
      std::string line = fmt::format("ratio {}/{} {} {} bytes: ", impl, reference, op, bytes);
      if (!base || !r["supported"].get<bool>() || !(*base)["supported"].get<bool>()) {
        const std::string who = !r["supported"].get<bool>() ? impl : reference;
        std::cout << line << "n/a (" << who << " does not support " << op << ")\n";
        continue;
      }
      const double busbwRatio = r["busbw_gbps"].get<double>() / (*base)["busbw_gbps"].get<double>();
      const double timeRatio = r["time_us"].get<double>() / (*base)["time_us"].get<double>();
      std::cout << line << fmt::format("busbw {:.2f}x, time {:.2f}x\n", busbwRatio, timeRatio);
    }
  }
}

// The bar for alltoall and sendrecv (issue 34): from 64 KiB, busbw
// at least 1.5x c10d's, or at least 85% of the bare sockets' where that is
// the lower of the two. One line per point of every contender, when both
// references ran; the last line counts the points that miss it.
void printTargets(const json& records, const std::vector<std::string>& impls) {
  constexpr int64_t kFrom = 64 * 1024;
  constexpr double kOverC10d = 1.5, kOfWire = 0.85;
  const auto has = [&](const std::string& impl) { return std::find(impls.begin(), impls.end(), impl) != impls.end(); };
  if (!has(kC10dGloo) || !has(kTcpWire)) return;
  int points = 0, missed = 0;
  for (const auto& r : records) {
    const std::string impl = r["impl"], op = r["op"];
    const int64_t bytes = r["bytes"];
    if (impl == kC10dGloo || impl == kTcpWire || (op != "alltoall" && op != "sendrecv") || bytes < kFrom ||
        !r["supported"].get<bool>()) {
      continue;
    }
    const json* c10d = findRecord(records, kC10dGloo, op, bytes);
    const json* wire = findRecord(records, kTcpWire, op, bytes);
    if (!c10d || !wire || !(*c10d)["supported"].get<bool>() || !(*wire)["supported"].get<bool>()) continue;
    if (points == 0) {
      std::cout << fmt::format("\n# targets: {} and sendrecv from {} bytes, busbw >= min({}x {}, {}x {})\n",
                               "alltoall", kFrom, kOverC10d, kC10dGloo, kOfWire, kTcpWire);
    }
    const double busbw = r["busbw_gbps"].get<double>();
    const double needed = std::min(kOverC10d * (*c10d)["busbw_gbps"].get<double>(),
                                   kOfWire * (*wire)["busbw_gbps"].get<double>());
    const bool met = busbw >= needed;
    ++points;
    if (!met) ++missed;
    std::cout << fmt::format("target {} {} {} bytes: busbw {:.3f} GB/s, needs {:.3f}: {}\n", impl, op, bytes, busbw,
                             needed, met ? "met" : "MISSED");
  }
  if (points > 0) std::cout << fmt::format("# targets met at {} of {} points\n", points - missed, points);
}

void runLauncher(Options o) {
  checkOutputPaths(o.jsonPath, o.plotPath);
  std::unique_ptr<SimCluster> cluster;
  HostLayout layout;
  if (!o.hosts.empty()) {
    cluster = clusterFromOptions(o.hosts, o.link, layout, std::cout);
    if (!cluster) return;  // SKIPPED, said
    o.worldSize = layout.worldSize();
  }
  if (o.worldSize < 2) throw BenchError("--world-size must be at least 2");
  if (o.iters < 1 || o.warmup < 0) throw BenchError("--iters must be at least 1 and --warmup at least 0");
  const auto ops = parseOps(o.ops);
  const auto sizes = sweepSizes(o);
  const auto impls = selectImpls(o);
  for (CollectiveOp op : ops) {
    for (int64_t bytes : sizes) {
      if (!planPoint(op, bytes, o.worldSize)) {
        std::cout << fmt::format("# skipping {} at {} bytes: too small for {} ranks of float32\n", opName(op), bytes,
                                 o.worldSize);
      }
    }
  }

  TempDir dir("ddp-bench-collectives-");
  // The job's store secret, inherited by every worker (our TCPStore checks it).
  ::setenv(kStoreTokenEnv, randomHex(16).c_str(), 1);

  std::cout.flush();  // the notes above come before the workers' output
  json records = json::array();
  for (const auto& impl : impls) {
    std::cerr << fmt::format("running {} on {} ranks...\n", impl, o.worldSize);
    launchRanks(
        o.worldSize, [&](int rank) { return workerArguments(o, impl, rank, dir.path()); },
        std::chrono::seconds(o.timeoutSeconds), dir.path(), impl, cluster.get(), layout);
    for (auto& r : readJsonFile(resultsPath(dir.path(), impl))) records.push_back(r);
  }
  // Rows of one op and size next to each other, implementations in run order.
  auto rank = [&](const json& r) {
    const auto op = std::find(o.ops.begin(), o.ops.end(), r["op"].get<std::string>()) - o.ops.begin();
    return std::make_pair(op, r["bytes"].get<int64_t>());
  };
  std::stable_sort(records.begin(), records.end(), [&](const json& a, const json& b) { return rank(a) < rank(b); });

  printTable(records, impls);
  printRatios(records, impls, kC10dGloo, "busbw ratio > 1 and time ratio < 1: ours is faster");
  printRatios(records, impls, kTcpWire, "busbw ratio: the share of the bare sockets' bandwidth reached");
  printTargets(records, impls);
  if (!o.jsonPath.empty() || !o.plotPath.empty()) {
    json out = json::array();
    for (const auto& r : records) {
      out.push_back({{"impl", r["impl"]},
                     {"op", r["op"]},
                     {"world_size", r["world_size"]},
                     {"bytes", r["bytes"]},
                     {"count", r["count"]},
                     {"dtype", r["dtype"]},
                     {"redop", r["redop"]},
                     {"root", r["root"]},
                     {"wrong", r["wrong"]},
                     {"time_us", r["time_us"]},
                     {"algbw_gbps", r["algbw_gbps"]},
                     {"busbw_gbps", r["busbw_gbps"]},
                     {"supported", r["supported"]},
                     {"hosts", o.hosts.empty() ? "1x" + std::to_string(o.worldSize) : o.hosts},
                     {"link", o.hosts.empty() ? "local" : o.link}});
    }
    writeRecords(o.jsonPath, o.plotPath, out);
  }
}

}  // namespace collectives

void registerCollectivesCommand(CLI::App& app) {
  using namespace collectives;
  auto options = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "collectives", "Time collectives and send/recv per backend vs LibTorch's c10d Gloo");
  cmd->add_option("--world-size,-n", options->worldSize, "Ranks (one process each)")->capture_default_str();
  cmd->add_option("--min-bytes", options->minBytes, "Smallest message (suffixes K, M, G)")->capture_default_str();
  cmd->add_option("--max-bytes", options->maxBytes, "Largest message (suffixes K, M, G)")->capture_default_str();
  cmd->add_option("--size-factor", options->sizeFactor, "Each size is this many times the previous one")
      ->capture_default_str();
  cmd->add_option("--ops", options->ops,
                  "Comma-separated: allreduce, allgather, broadcast, reduce_scatter, alltoall, gather, scatter, "
                  "sendrecv (a ping-pong between rank 0 and the last rank)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--impls", options->impls,
                  "Comma-separated implementations (default: every CPU backend and c10d-gloo, if built; "
                  "tcp-wire, bare sockets moving the same bytes, only when named)")
      ->delimiter(',');
  cmd->add_option("--warmup", options->warmup, "Untimed iterations per point")->capture_default_str();
  cmd->add_option("--iters", options->iters, "Timed iterations per point (halved, min 5, from 16 MiB)")
      ->capture_default_str();
  cmd->add_flag("--verify", options->verify, "Check every result against its closed form; a mismatch fails the run");
  cmd->add_option("--json", options->jsonPath, "Also write the records to this JSON file");
  cmd->add_option("--plot", options->plotPath, "Also draw bus bandwidth against size into this PNG (scripts/ddp-plot)");
  cmd->add_option("--timeout", options->timeoutSeconds, "Seconds all ranks of one implementation may take")
      ->capture_default_str();
  cmd->add_option("--collective-timeout", options->collectiveTimeoutSeconds,
                  "Seconds one collective (or the rendezvous) may take")
      ->capture_default_str();
  cmd->add_option("--hosts", options->hosts,
                  "Run on a simulated cluster of HOSTSxRANKS (e.g. 2x2): network namespaces joined by shaped links "
                  "(needs root; replaces --world-size)");
  cmd->add_option("--link", options->link, "The simulated cluster's links: 10gbit, 1gbit or none")
      ->capture_default_str();
  // Worker flags: set by the launcher; an empty group hides them from --help.
  cmd->add_option("--worker-rank", options->workerRank)->group("");
  cmd->add_option("--worker-impl", options->workerImpl)->group("");
  cmd->add_option("--worker-dir", options->workerDir)->group("");

  cmd->callback([options] {
    if (options->workerRank >= 0) {
      if (runWorker(*options) != 0) throw CLI::RuntimeError(1);
      return;
    }
    try {
      runLauncher(*options);
    } catch (const std::exception& e) {
      std::cerr << "ddp-bench collectives: error: " << e.what() << "\n";
      throw CLI::RuntimeError(1);
    }
  });
}

}  // namespace ddp::bench
