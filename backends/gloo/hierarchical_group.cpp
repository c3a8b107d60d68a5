#include "backends/gloo/hierarchical_group.hpp"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "backends/gloo/host_tensors.hpp"
#include "backends/gloo/shm_channel.hpp"
#include "framework/comm/collective_args.hpp"
#include "framework/core/errors.hpp"
#include "framework/core/strings.hpp"

namespace ddp::gloo_backend {

int HostLayout::largestHost() const {
  size_t most = 0;
  for (const auto& ranks : ranksOn) most = std::max(most, ranks.size());
  return static_cast<int>(most);
}

std::optional<HostLayout> discoverHostLayout(Store& store, int rank, int size, const std::string& hostId, bool flat,
                                             Milliseconds timeout) {
  auto keyOf = [](int r) { return "hosts/" + std::to_string(r); };
  // "flat" cannot be a detected identity (those hold '|').
  store.setString(keyOf(rank), flat ? std::string("flat") : hostId.empty() ? ShmChannel::hostIdentity() : "id " + hostId);
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(keyOf(r));
  store.wait(keys, timeout);
  for (int r = 0; r < size; ++r) {
    if (store.getString(keyOf(r)) == "flat") return std::nullopt;
  }
  HostLayout layout;
  layout.hostOf.assign(static_cast<size_t>(size), -1);
  layout.indexOf.assign(static_cast<size_t>(size), -1);
  std::map<std::string, int> hostByName;
  for (int r = 0; r < size; ++r) {
    const std::string name = store.getString(keyOf(r));
    auto [it, added] = hostByName.emplace(name, layout.hosts());
    if (added) layout.ranksOn.emplace_back();
    auto& ranks = layout.ranksOn[static_cast<size_t>(it->second)];
    layout.hostOf[static_cast<size_t>(r)] = it->second;
    layout.indexOf[static_cast<size_t>(r)] = static_cast<int>(ranks.size());
    ranks.push_back(r);
  }
  return layout;
}

namespace {

// 16 KiB and below, a collective runs in the caller when nothing is queued.
constexpr size_t kInlineMaxBytes = 16 * 1024;

std::string ranksText(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

ReduceOp levelOp(ReduceOp op) { return op == ReduceOp::Avg ? ReduceOp::Sum : op; }

// Elements per pipeline chunk of an allreduce: the whole tensor up to
// 1 MiB, then up to 8 chunks of at least 512 KiB.
int64_t pipelineChunk(const at::Tensor& flat) {
  const int64_t bytes = static_cast<int64_t>(flat.nbytes());
  if (bytes <= (int64_t(1) << 20)) return std::max<int64_t>(flat.numel(), 1);
  const int64_t chunkBytes = std::max<int64_t>(int64_t(1) << 20, (bytes + 3) / 4);
  return std::max<int64_t>(1, chunkBytes / static_cast<int64_t>(flat.element_size()));
}

}  // namespace

struct HierarchicalGroup::Impl {
  using Steps = std::function<void()>;
  struct Task {
    WorkPtr work;
    Steps steps;
  };

  Impl(int rank, int size, HostLayout layout, std::shared_ptr<ProcessGroupGloo> local,
       std::shared_ptr<ProcessGroupGloo> leaders)
      : rank(rank),
        size(size),
        layout(std::move(layout)),
        host(this->layout.hostOf[static_cast<size_t>(rank)]),
        index(this->layout.indexOf[static_cast<size_t>(rank)]),
        local(std::move(local)),
        leaders(std::move(leaders)) {
    // What the sub-groups' own errors call rank i, in global ranks.
    std::vector<int> leaderRanks;
    for (const auto& ranks : this->layout.ranksOn) leaderRanks.push_back(ranks.front());
    hostRanks = fmt::format("this host's group is ranks {} in that order",
                            ranksText(this->layout.ranksOn[static_cast<size_t>(host)]));
    leaderNames = fmt::format("the leaders' group is ranks {} in that order", ranksText(leaderRanks));
    worker = std::thread([this] {
      ShmChannel::markBackgroundThread();
      loop();
    });
  }

  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stopping = true;
    }
    wake.notify_all();
    worker.join();
  }

  // Runs `steps` as collective `what`, in call order.
  WorkPtr enqueue(const std::string& what, size_t bytes, Milliseconds timeout, Steps steps) {
    std::unique_lock<std::mutex> lock(mutex);
    const uint64_t seq = nextSeq++;
    auto work = std::make_shared<Work>(
        fmt::format("[rank {}/{}] gloo ({} hosts) {} #{}", rank, size, layout.hosts(), what, seq), timeout);
    if (broken) {
      lock.unlock();
      work->finish(broken);
      return work;
    }
    if (bytes <= kInlineMaxBytes && queue.empty() && !running) {
      running = true;
      lock.unlock();
      finishTask(Task{work, std::move(steps)});
      return work;
    }
    queue.push_back(Task{work, std::move(steps)});
    lock.unlock();
    wake.notify_one();
    return work;
  }

  void loop() {
    std::unique_lock<std::mutex> lock(mutex);
    for (;;) {
      wake.wait(lock, [&] { return (!queue.empty() && !running) || (stopping && queue.empty()); });
      if (queue.empty()) return;
      Task task = std::move(queue.front());
      queue.pop_front();
      running = true;
      lock.unlock();
      finishTask(std::move(task));
      lock.lock();
    }
  }

  // Runs the steps (one task at a time: `running` is set) and finishes its
  // Work after clearing `running`, so a waiter that queues the next one
  // finds the group idle.
  void finishTask(Task task) {
    std::exception_ptr error;
    {
      std::lock_guard<std::mutex> lock(mutex);
      error = broken;
    }
    if (!error) {
      try {
        task.steps();
      } catch (const c10::Error& e) {
        error = std::make_exception_ptr(
            CollectiveError(fmt::format("{}: {}", task.work->description(), e.what_without_backtrace())));
      } catch (const std::exception& e) {
        error = std::make_exception_ptr(CollectiveError(fmt::format("{}: {}", task.work->description(), e.what())));
      } catch (...) {
        error = std::make_exception_ptr(CollectiveError(task.work->description() + ": unknown failure"));
      }
      if (error) {
        // The host's other ranks may wait in a step with this one: they
        // fail now, not at their timeout.
        const std::string why = fmt::format("rank {} failed in {}", rank, task.work->description());
        local->abort(why);
        if (leaders) leaders->abort(why);
      }
    }
    bool queued = false;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (error && !broken) broken = error;
      running = false;
      queued = !queue.empty();
    }
    // Only the worker waits on `wake`, and only for queued tasks: an idle
    // worker is not woken after a task run in the caller.
    if (queued) wake.notify_all();
    task.work->finish(error);
  }

  // One step on a sub-group, waited for; its failure names the step and
  // the global ranks behind the sub-group's numbering.
  void step(const char* where, const WorkPtr& work) {
    try {
      work->wait();
    } catch (const std::exception& e) {
      const bool acrossHosts = std::string(where).rfind("cross-host", 0) == 0;
      throw CollectiveError(fmt::format("{} step failed ({}): {}", where, acrossHosts ? leaderNames : hostRanks,
                                        e.what()));
    }
  }

  bool leads() const { return leaders != nullptr; }
  // The first failure, once broken; else null.
  std::exception_ptr failure() {
    std::lock_guard<std::mutex> lock(mutex);
    return broken;
  }

  const int rank, size;
  const HostLayout layout;
  const int host, index;  // this rank's host, and its place there
  std::shared_ptr<ProcessGroupGloo> local, leaders;
  std::string hostRanks, leaderNames;  // for errors

  std::mutex mutex;
  std::condition_variable wake;
  std::deque<Task> queue;
  bool running = false, stopping = false;
  uint64_t nextSeq = 0;
  std::exception_ptr broken;
  std::atomic<bool> closing{false};  // being destroyed: a failed send/recv breaks nothing then
  std::thread worker;
};

HierarchicalGroup::HierarchicalGroup(int rank, int size, ProcessGroupOptions options, HostLayout layout,
                                     std::shared_ptr<ProcessGroupGloo> local, std::shared_ptr<ProcessGroupGloo> leaders,
                                     std::unique_ptr<PointToPoint> p2p)
    : ProcessGroup(rank, size, std::move(options)),
      impl_(std::make_unique<Impl>(rank, size, std::move(layout), std::move(local), std::move(leaders))),
      p2p_(std::move(p2p)) {
  // A failed send or recv breaks the group, as a failed collective does,
  // and aborts the sub-groups so that this host's other ranks fail at once.
  Impl* g = impl_.get();
  p2p_->setFailureHook([g](const std::string& why, bool timedOut) {
    if (g->closing.load()) return;
    {
      std::lock_guard<std::mutex> lock(g->mutex);
      if (!g->broken) g->broken = std::make_exception_ptr(CollectiveError(why));
    }
    if (timedOut) return;  // the peers time out by themselves, as after a collective's timeout
    g->local->abort(why);
    if (g->leaders) g->leaders->abort(why);
  });
}


void HierarchicalGroup::abort(const std::string& reason) {
  Impl* g = impl_.get();
  {
    std::lock_guard<std::mutex> lock(g->mutex);
    if (!g->broken) g->broken = std::make_exception_ptr(CollectiveError(reason));
  }
  g->local->abort(reason);
  if (g->leaders) g->leaders->abort(reason);
}

WorkPtr HierarchicalGroup::send(const at::Tensor& tensor, int dst, const SendOptions& opts) {
  if (opts.tag < 0) {
    fail<UsageError>("[rank {}/{}] gloo send: tag {} is negative (negative tags are internal)", rank(), size(), opts.tag);
  }
  if (std::exception_ptr broken = impl_->failure()) {
    return Work::failedEarlier(fmt::format("[rank {}/{}] gloo send to rank {}", rank(), size(), dst), broken);
  }
  return p2p_->send(tensor, dst, opts.tag, resolveTimeout(opts.timeout));
}

WorkPtr HierarchicalGroup::recv(at::Tensor& tensor, int src, const RecvOptions& opts) {
  if (opts.tag < 0) {
    fail<UsageError>("[rank {}/{}] gloo recv: tag {} is negative (negative tags are internal)", rank(), size(), opts.tag);
  }
  if (std::exception_ptr broken = impl_->failure()) {
    return Work::failedEarlier(fmt::format("[rank {}/{}] gloo recv from rank {}", rank(), size(), src), broken);
  }
  return p2p_->recv(tensor, src, opts.tag, resolveTimeout(opts.timeout));
}

HierarchicalGroup::~HierarchicalGroup() {
  // A block collective still queued fails on the closed transport instead
  // of touching a destroyed one; then the worker stops.
  impl_->closing = true;
  p2p_->shutdown();
  impl_.reset();
}

const HostLayout& HierarchicalGroup::layout() const { return impl_->layout; }

std::string HierarchicalGroup::describeEndpoint() const {
  const auto& l = impl_->layout;
  std::string text = fmt::format("is rank {} of {} on host {} of {}: shared memory within the host", impl_->index,
                                 l.ranksOn[static_cast<size_t>(impl_->host)].size(), impl_->host, l.hosts());
  if (impl_->leads()) text += "; leads it over TCP, " + impl_->leaders->describeEndpoint();
  return text;
}

WorkPtr HierarchicalGroup::allreduce(at::Tensor& tensor, const AllreduceOptions& opts) {
  requireSupported(tensor, "allreduce");
  const Milliseconds timeout = resolveTimeout(opts.timeout);
  at::Tensor t = tensor;
  const ReduceOp op = opts.op;
  Impl* g = impl_.get();
  return g->enqueue(fmt::format("allreduce ({})", summarize(tensor, reduceOpName(op))), tensor.nbytes(), timeout,
                    [g, t, op, timeout]() mutable {
                      if (t.numel() == 0) return;
                      const ReduceOp level = levelOp(op);
                      at::Tensor flat = t.is_contiguous() ? t.view(-1) : t.contiguous().view(-1);
                      // Pipelined by chunks: the leaders send chunk i across while
                      // the host reduces chunk i+1 and shares chunk i-1. Every rank
                      // queues the host's collectives in one order: all
                      // reductions, then all broadcasts.
                      const int64_t chunk = pipelineChunk(flat);
                      std::vector<at::Tensor> chunks;
                      for (int64_t at = 0; at < flat.numel(); at += chunk) {
                        chunks.push_back(flat.narrow(0, at, std::min(chunk, flat.numel() - at)));
                      }
                      std::vector<WorkPtr> reduced, crossed, shared;
                      for (auto& c : chunks) reduced.push_back(g->local->allreduce(c, {level, timeout}));
                      if (g->leads()) {
                        for (size_t i = 0; i < chunks.size(); ++i) {
                          g->step("host reduce", reduced[i]);
                          crossed.push_back(g->leaders->allreduce(chunks[i], {level, timeout}));
                        }
                      }
                      for (size_t i = 0; i < chunks.size(); ++i) {
                        if (g->leads()) g->step("cross-host (leaders)", crossed[i]);
                        shared.push_back(g->local->broadcast(chunks[i], {0, timeout}));
                      }
                      for (size_t i = 0; i < chunks.size(); ++i) {
                        g->step("host reduce", reduced[i]);
                        g->step("host broadcast", shared[i]);
                      }
                      if (op == ReduceOp::Avg) divideInPlace(flat, g->size);
                      if (!flat.is_same(t) && flat.data_ptr() != t.data_ptr()) t.copy_(flat.view(t.sizes()));
                    });
}

WorkPtr HierarchicalGroup::broadcast(at::Tensor& tensor, const BroadcastOptions& opts) {
  requireSupported(tensor, "broadcast");
  if (opts.root < 0 || opts.root >= size()) {
    fail<UsageError>("[rank {}/{}] gloo broadcast: root {} is not a rank of this group (0..{})", rank(), size(),
                     opts.root, size() - 1);
  }
  const Milliseconds timeout = resolveTimeout(opts.timeout);
  at::Tensor t = tensor;
  const int root = opts.root;
  Impl* g = impl_.get();
  return g->enqueue(fmt::format("broadcast ({}, root {})", summarize(tensor, nullptr), root), tensor.nbytes(),
                    timeout, [g, t, root, timeout]() mutable {
                      const int rootHost = g->layout.hostOf[static_cast<size_t>(root)];
                      const int rootIndex = g->layout.indexOf[static_cast<size_t>(root)];
                      if (g->host == rootHost) g->step("host broadcast from the root", g->local->broadcast(t, {rootIndex, timeout}));
                      if (g->leads()) g->step("cross-host (leaders)", g->leaders->broadcast(t, {rootHost, timeout}));
                      if (g->host != rootHost) g->step("host broadcast", g->local->broadcast(t, {0, timeout}));
                    });
}

WorkPtr HierarchicalGroup::allgather(const at::Tensor& input, at::Tensor& output, const AllgatherOptions& opts) {
  requireSupported(input, "allgather");
  requireSupported(output, "allgather");
  if (output.numel() != input.numel() * size() || output.scalar_type() != input.scalar_type()) {
    fail<UsageError>("[rank {}/{}] gloo allgather: output has {} elements of {}, expected {} x {} of {}", rank(),
                     size(), output.numel(), dtypeName(output), size(), input.numel(), dtypeName(input));
  }
  const Milliseconds timeout = resolveTimeout(opts.timeout);
  at::Tensor in = input, out = output;
  Impl* g = impl_.get();
  return g->enqueue(fmt::format("allgather ({})", summarize(input, nullptr)), input.nbytes(), timeout,
                    [g, in, out, timeout]() mutable {
                      const int64_t n = in.numel();
                      if (n == 0) return;
                      const auto& layout = g->layout;
                      const int64_t hostRanks = static_cast<int64_t>(layout.ranksOn[static_cast<size_t>(g->host)].size());
                      const int64_t block = layout.largestHost() * n;  // one host's, padded
                      at::Tensor mine = at::zeros({block}, in.options().device(at::kCPU));
                      at::Tensor gathered = mine.narrow(0, 0, hostRanks * n);
                      g->step("host allgather", g->local->allgather(in.contiguous().view(-1).cpu(), gathered, {timeout}));
                      at::Tensor all = at::empty({layout.hosts() * block}, mine.options());
                      if (g->leads()) g->step("cross-host (leaders)", g->leaders->allgather(mine, all, {timeout}));
                      g->step("host broadcast", g->local->broadcast(all, {0, timeout}));
                      at::Tensor host = hostView(out);  // contiguous, on the CPU
                      at::Tensor flat = host.view(-1);
                      for (int r = 0; r < g->size; ++r) {
                        flat.narrow(0, r * n, n).copy_(all.narrow(0, layout.byHostOffset(r, n), n));
                      }
                      if (!host.is_same(out)) out.copy_(host);
                    });
}

WorkPtr HierarchicalGroup::reduceScatter(const at::Tensor& input, at::Tensor& output,
                                         const ReduceScatterOptions& opts) {
  requireSupported(input, "reduce_scatter");
  requireSupported(output, "reduce_scatter");
  if (input.numel() != output.numel() * size() || output.scalar_type() != input.scalar_type()) {
    fail<UsageError>("[rank {}/{}] gloo reduce_scatter: input has {} elements of {}, expected {} x {} of {}", rank(),
                     size(), input.numel(), dtypeName(input), size(), output.numel(), dtypeName(output));
  }
  const Milliseconds timeout = resolveTimeout(opts.timeout);
  at::Tensor in = input, out = output;
  const ReduceOp op = opts.op;
  Impl* g = impl_.get();
  return g->enqueue(fmt::format("reduce_scatter ({})", summarize(output, reduceOpName(op))), input.nbytes(), timeout,
                    [g, in, out, op, timeout]() mutable {
                      const int64_t n = out.numel();
                      if (n == 0) return;
                      const auto& layout = g->layout;
                      const ReduceOp level = levelOp(op);
                      const int64_t block = layout.largestHost() * n;
                      // The input laid out by host (padded blocks), reduced on this host.
                      at::Tensor byHost = at::zeros({layout.hosts() * block}, out.options().device(at::kCPU));
                      const at::Tensor flatIn = in.contiguous().view(-1).cpu();
                      for (int r = 0; r < g->size; ++r) {
                        byHost.narrow(0, layout.byHostOffset(r, n), n).copy_(flatIn.narrow(0, r * n, n));
                      }
                      g->step("host reduce", g->local->allreduce(byHost, {level, timeout}));
                      at::Tensor hostBlock = at::empty({block}, byHost.options());
                      if (g->leads()) {
                        g->step("cross-host (leaders)", g->leaders->reduceScatter(byHost, hostBlock, {level, timeout}));
                      }
                      g->step("host broadcast", g->local->broadcast(hostBlock, {0, timeout}));
                      at::Tensor result = hostBlock.narrow(0, g->index * n, n);
                      if (op == ReduceOp::Avg) divideInPlace(result, g->size);
                      at::Tensor host = hostView(out);
                      host.view(-1).copy_(result);
                      if (!host.is_same(out)) out.copy_(host);
                    });
}

WorkPtr HierarchicalGroup::barrier(const BarrierOptions& opts) {
  const Milliseconds timeout = resolveTimeout(opts.timeout);
  Impl* g = impl_.get();
  return g->enqueue("barrier", 0, timeout, [g, timeout] {
    g->step("host barrier", g->local->barrier({timeout}));
    if (g->leads()) g->step("cross-host barrier (leaders)", g->leaders->barrier({timeout}));
    g->step("host barrier (release)", g->local->barrier({timeout}));
  });
}

at::Tensor HierarchicalGroup::allocateCommunicationBuffer(int64_t numel, const at::TensorOptions& options) {
  return impl_->local->allocateCommunicationBuffer(numel, options);
}

// ---- a block per pair of ranks, point to point -------------------------------------

WorkPtr HierarchicalGroup::blocks(int tag, const std::string& what, size_t bytes, Milliseconds timeout,
                                  std::vector<at::Tensor> sends, std::vector<at::Tensor> recvs,
                                  std::function<void()> after) {
  Impl* g = impl_.get();
  PointToPoint* p2p = p2p_.get();
  const std::string label = fmt::format("[rank {}/{}] gloo ({} hosts) {}", rank(), size(), g->layout.hosts(), what);
  return g->enqueue(what, bytes, timeout, [=]() {
    const auto mine = static_cast<size_t>(g->rank);
    if (sends[mine].defined() && sends[mine].numel() > 0) recvs[mine].copy_(sends[mine]);
    exchangeBlocks(*p2p, g->rank, g->size, sends, recvs, tag, std::chrono::steady_clock::now() + timeout, label);
    if (after) after();
  });
}

namespace {
// The flat, contiguous host tensor behind `t`, and whether it is `t` itself.
at::Tensor flatHost(const at::Tensor& t) { return hostView(t).view({-1}); }
std::function<void()> copyBack(const at::Tensor& staged, at::Tensor target) {
  if (staged.data_ptr() == target.data_ptr() || target.numel() == 0) return {};
  return [staged, target]() mutable { target.copy_(staged.view(target.sizes())); };
}
// The blocks of the exchanging pairs as views of a flat tensor, empty ones
// included (undefined: the pair exchanges nothing).
std::vector<at::Tensor> views(const at::Tensor& flat, const std::vector<int64_t>& at, const std::vector<int64_t>& count,
                              const std::vector<bool>& exchanges) {
  std::vector<at::Tensor> out(count.size());
  for (size_t p = 0; p < count.size(); ++p) {
    if (exchanges[p]) out[p] = flat.narrow(0, at[p], count[p]);
  }
  return out;
}
}  // namespace

WorkPtr HierarchicalGroup::gather(const at::Tensor& input, at::Tensor& output, const GatherOptions& opts) {
  const int tag = nextBlockTag();
  checkGather(rank(), size(), input, output, opts.root);
  requireSupported(input, "gather");
  const bool isRoot = rank() == opts.root;
  if (isRoot) requireSupported(output, "gather");
  const BlockCounts b = gatherBlocks(rank(), size(), opts.root, input.numel());
  at::Tensor in = flatHost(input), out = isRoot ? flatHost(output) : at::Tensor();
  return blocks(tag, fmt::format("gather ({}, root {})", summarize(input, nullptr), opts.root),
                isRoot ? output.nbytes() : input.nbytes(), resolveTimeout(opts.timeout), views(in, b.sendAt, b.sendCount, b.sendsTo),
                views(out, b.recvAt, b.recvCount, b.receivesFrom), isRoot ? copyBack(out, output) : nullptr);
}

WorkPtr HierarchicalGroup::scatter(const at::Tensor& input, at::Tensor& output, const ScatterOptions& opts) {
  const int tag = nextBlockTag();
  checkScatter(rank(), size(), input, output, opts.root);
  requireSupported(output, "scatter");
  const bool isRoot = rank() == opts.root;
  if (isRoot) requireSupported(input, "scatter");
  const BlockCounts b = scatterBlocks(rank(), size(), opts.root, output.numel());
  at::Tensor in = isRoot ? flatHost(input) : at::Tensor(), out = flatHost(output);
  return blocks(tag, fmt::format("scatter ({}, root {})", summarize(output, nullptr), opts.root),
                isRoot ? input.nbytes() : output.nbytes(), resolveTimeout(opts.timeout), views(in, b.sendAt, b.sendCount, b.sendsTo),
                views(out, b.recvAt, b.recvCount, b.receivesFrom), copyBack(out, output));
}

WorkPtr HierarchicalGroup::alltoall(const at::Tensor& input, at::Tensor& output,
                                    const std::vector<int64_t>& inputSplits, const std::vector<int64_t>& outputSplits,
                                    const AlltoallOptions& opts) {
  const int tag = nextBlockTag();
  requireSupported(input, "alltoall");
  requireSupported(output, "alltoall");
  const AlltoallSplits splits = checkAlltoall(rank(), size(), input, output, inputSplits, outputSplits);
  checkOwnRows(rank(), size(), splits);
  const BlockCounts b = alltoallBlocks(splits);
  at::Tensor in = flatHost(input), out = flatHost(output);
  return blocks(tag, fmt::format("alltoall ({})", summarize(input, nullptr)), std::max(input.nbytes(), output.nbytes()),
                resolveTimeout(opts.timeout), views(in, b.sendAt, b.sendCount, b.sendsTo), views(out, b.recvAt, b.recvCount, b.receivesFrom),
                copyBack(out, output));
}

}  // namespace ddp::gloo_backend
