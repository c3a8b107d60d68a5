#include "backends/gloo/process_group_gloo.hpp"
#include "backends/gloo/reduce_kernels.hpp"
#include "backends/gloo/shm_channel.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <gloo/allgather.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "framework/core/errors.hpp"
#include "framework/core/help_links.hpp"
#include "framework/store/prefix_store.hpp"

namespace ddp {
namespace {

using Clock = std::chrono::steady_clock;
using Descriptor = ProcessGroupGloo::Descriptor;

enum OpCode : uint32_t { kAllreduce = 1, kBroadcast, kAllgather, kReduceScatter, kBarrier };

const char* opName(uint32_t op) {
  switch (op) {
    case kAllreduce: return "allreduce";
    case kBroadcast: return "broadcast";
    case kAllgather: return "allgather";
    case kReduceScatter: return "reduce_scatter";
    case kBarrier: return "barrier";
  }
  return "?";
}

// Slots tell apart the messages of concurrent phases. Ours keep the top byte
// zero; Gloo's own collectives put an algorithm prefix there.
enum Phase : uint64_t { kFramePhase = 1, kScatterPhase = 2, kGatherPhase = 3 };
uint64_t slotFor(uint64_t seq, Phase phase) { return (seq << 8) | phase; }

// Pipelining granularity of the ring: large enough to amortize a message,
// small enough that reduction overlaps transfer (measured: docs/performance.md).
size_t chunkBytes() {
  static const size_t bytes = [] {
    const size_t fallback = size_t(512) * 1024;
    const char* env = std::getenv("DDP_GLOO_CHUNK_BYTES");
    if (env == nullptr || *env == '\0') return fallback;
    char* end = nullptr;
    const long long v = std::strtoll(env, &end, 10);
    if (*end != '\0' || v <= 0) {
      throw UsageError("DDP_GLOO_CHUNK_BYTES=\"" + std::string(env) +
                       "\": expected a number of bytes > 0. HINT: unset it for the default, " +
                       std::to_string(fallback));
    }
    return static_cast<size_t>(v);
  }();
  return bytes;
}

std::chrono::milliseconds remaining(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return std::max(left, std::chrono::milliseconds(1));
}

// ---- reduction kernels (reduce_kernels.cpp) ---------------------------------
static_assert(static_cast<int>(ReduceOp::Sum) == kReduceSum && static_cast<int>(ReduceOp::Avg) == kReduceAvg &&
                  static_cast<int>(ReduceOp::Min) == kReduceMin && static_cast<int>(ReduceOp::Max) == kReduceMax &&
                  static_cast<int>(ReduceOp::Product) == kReduceProduct,
              "reduce_kernels.hpp must number the operations as ReduceOp does");

using ReduceFn = void (*)(void*, const void*, size_t, int);

ReduceFn reduceFnFor(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return reduceFloat;
    case at::kDouble: return reduceDouble;
    case at::kInt: return reduceInt32;
    case at::kLong: return reduceInt64;
    case at::kHalf: return reduceHalf;
    case at::kBFloat16: return reduceBFloat16;
    default: return nullptr;
  }
}

void divideInPlace(at::Tensor t, int64_t divisor) {
  if (at::isIntegralType(t.scalar_type(), /*includeBool=*/false)) {
    t.div_(divisor, "trunc");
  } else {
    t.div_(static_cast<double>(divisor));
  }
}

void requireSupported(const at::Tensor& t, const char* op) {
  if (!reduceFnFor(t.scalar_type())) {
    throw UsageError(std::string("gloo ") + op + ": dtype " + c10::toString(t.scalar_type()) +
                     " is not supported; use float32, float64, float16, bfloat16, int32 or int64");
  }
}

// A contiguous host tensor that aliases `t` when it can, or a staged copy.
at::Tensor hostView(const at::Tensor& t) {
  if (t.is_cpu() && t.is_contiguous()) return t;
  return t.to(at::kCPU).contiguous();
}

// Gloo's rendezvous talks to our Store through this adapter.
class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  explicit GlooStoreAdapter(std::shared_ptr<ddp::Store> store) : store_(std::move(store)) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(key, Bytes(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    Bytes b = store_->get(key);
    return std::vector<char>(b.begin(), b.end());
  }
  void wait(const std::vector<std::string>& keys) override { store_->wait(keys); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    store_->wait(keys, timeout);
  }

 private:
  std::shared_ptr<ddp::Store> store_;
};

std::string describeCall(int rank, int size, const Descriptor& d, const std::string& summary) {
  return "[rank " + std::to_string(rank) + "/" + std::to_string(size) + "] gloo " + opName(d.op) + " #" +
         std::to_string(d.seq) + " (" + summary + ")";
}

std::string describePeer(const Descriptor& d) {
  return std::string(opName(d.op)) + " #" + std::to_string(d.seq) + " with " + std::to_string(d.numel) +
         " elements, dtype code " + std::to_string(d.dtype) + ", root " + std::to_string(d.root) + ", op " +
         reduceOpName(static_cast<ReduceOp>(d.reduceOp)) +
         (d.sharedBuffer ? ", in shared buffer #" + std::to_string(d.sharedBuffer - 1) : std::string());
}

}  // namespace

// ---- interface selection -----------------------------------------------------
std::string localAddressTowards(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), "9", &hints, &found) != 0 || !found) {
    throw UsageError("gloo: cannot resolve master address '" + host +
                     "'. HINT: set MASTER_ADDR to a reachable host name or IP address");
  }
  std::string result;
  for (addrinfo* ai = found; ai && result.empty(); ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, SOCK_DGRAM, 0);
    if (fd < 0) continue;
    // connect() on a UDP socket sends nothing; it only picks the route.
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
      sockaddr_storage local{};
      socklen_t len = sizeof(local);
      if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
        char text[INET6_ADDRSTRLEN] = {0};
        const void* addr = local.ss_family == AF_INET
                               ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
                               : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
        if (inet_ntop(local.ss_family, addr, text, sizeof(text))) result = text;
      }
    }
    ::close(fd);
  }
  freeaddrinfo(found);
  if (result.empty()) {
    throw UsageError("gloo: no local interface has a route to master address '" + host +
                     "'. HINT: check MASTER_ADDR, or set GLOO_SOCKET_IFNAME to the interface to use");
  }
  return result;
}

// ---- construction ------------------------------------------------------------
ProcessGroupGloo::ProcessGroupGloo(std::shared_ptr<Store> store, int rank, int size, ProcessGroupOptions options)
    : ProcessGroup(rank, size, std::move(options)) {
  // The tuning variables, checked here on every rank before any store
  // traffic: a mistake fails alike everywhere, not as a peer that vanished.
  chunkBytes();
  ShmChannel::checkSlotBytesVariable();
  const char* shmEnv = std::getenv("DDP_GLOO_SHM");
  if (shmEnv && *shmEnv && std::string(shmEnv) != "0" && std::string(shmEnv) != "1") {
    throw UsageError("DDP_GLOO_SHM=\"" + std::string(shmEnv) + "\": expected 0 (TCP only) or 1 (shared memory)");
  }
  gloo::transport::tcp::attr attr;
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  if (!options_.interface.empty()) {
    attr.iface = options_.interface;
  } else if (ifname && *ifname) {
    attr.iface = ifname;
  } else {
    attr.hostname = localAddressTowards(options_.masterAddr.empty() ? "127.0.0.1" : options_.masterAddr);
  }
  std::shared_ptr<gloo::transport::Device> device;
  try {
    device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    throw UsageError("[rank " + std::to_string(rank) + "] gloo: cannot open a TCP device on " +
                     (attr.iface.empty() ? "address " + attr.hostname : "interface " + attr.iface) + ": " +
                     e.what() + ". HINT: set GLOO_SOCKET_IFNAME to an existing interface (see `ip addr`)");
  }
  listenAddress_ = device->str();

  auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  context->setTimeout(options_.timeout);
  store_ = std::make_shared<PrefixStore>("gloo", store);
  GlooStoreAdapter adapter(store_);
  try {
    context->connectFullMesh(adapter, device);
  } catch (const std::exception& e) {
    throw CollectiveError("[rank " + std::to_string(rank) + "/" + std::to_string(size) +
                          "] gloo: rendezvous through " + store->describe() + " did not complete: " + e.what() +
                          ". HINT: every rank must start with the same WORLD_SIZE and MASTER_ADDR:MASTER_PORT; "
                          + kRendezvousHelp);
  }
  context_ = context;

  if (size_ > 1) {
    const bool wantShm = options_.sharedMemory && !(shmEnv && std::string(shmEnv) == "0");
    try {
      shm_ = ShmChannel::connect(*store_, rank, size, wantShm, options_.timeout, &shmWhyNot_);
    } catch (const std::exception& e) {
      throw CollectiveError("[rank " + std::to_string(rank) + "/" + std::to_string(size) +
                            "] gloo: shared-memory setup through " + store->describe() + " did not complete: " +
                            e.what() + ". HINT: a peer rank may have died during start-up; " + kRendezvousHelp);
    }
  }
  if (size_ > 1 && !shm_) {
    if (size_ <= kAllToAllMaxRanks) {
      for (int r = 0; r < size_; ++r) {
        if (r != rank_) framePeers_.push_back(r);
      }
    } else {
      framePeers_ = {(rank_ + 1) % size_};  // sent to the right, received from the left
    }
    sendFrame_.assign(kFrameBytes, 0);
    sendFrameBuffer_ = context_->createUnboundBuffer(sendFrame_.data(), kFrameBytes);
    for (int b = 0; b < 2; ++b) {
      recvFrames_[b].assign(kFrameBytes * size_, 0);
      recvFrameBuffers_[b].resize(size_);
      for (int peer = 0; peer < size_; ++peer) {
        if (peer == rank_) continue;
        recvFrameBuffers_[b][peer] =
            context_->createUnboundBuffer(recvFrames_[b].data() + peer * kFrameBytes, kFrameBytes);
      }
    }
    postFrameReceives(0);
    postFrameReceives(1);
  }
  worker_ = std::thread([this] { workerLoop(); });
}

std::string ProcessGroupGloo::describeEndpoint() const {
  // Gloo describes its device as "tcp, pci=, iface=eth0, speed=-1, addr=[10.0.0.2]".
  auto field = [&](const std::string& key, const std::string& end) {
    const size_t at = listenAddress_.find(key);
    if (at == std::string::npos) return std::string();
    const size_t from = at + key.size();
    return listenAddress_.substr(from, listenAddress_.find(end, from) - from);
  };
  std::string addr = field("addr=[", "]"), iface = field("iface=", ",");
  if (addr.empty()) addr = listenAddress_;
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  const std::string why = ifname && *ifname ? "from GLOO_SOCKET_IFNAME"
                                            : "the one that routes to MASTER_ADDR " + options_.masterAddr;
  return "listens on " + addr + " (interface " + (iface.empty() ? "?" : iface) + ", " + why + ")";
}

ProcessGroupGloo::~ProcessGroupGloo() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  queued_.notify_all();
  if (worker_.joinable()) worker_.join();
  // A rank that closes its connections while a peer still waits for the end
  // of the last collective would fail that peer ("connection closed by
  // peer"): healthy groups first agree through the store that all are done.
  // A broken rank still says it is closing, so that its peers need not wait.
  if (size_ > 1) {
    try {
      std::vector<std::string> keys;
      for (int r = 0; r < size_; ++r) keys.push_back("closed/" + std::to_string(r));
      store_->setString(keys[rank_], "1");
      if (!broken_) store_->wait(keys, std::chrono::milliseconds(10000));
    } catch (const std::exception&) {
      // A peer that is gone cannot be waited for; close anyway.
    }
  }
  // Unbound buffers first (pending receives into them are dropped), then the
  // connections, then the memory.
  sendFrameBuffer_.reset();
  recvFrameBuffers_[0].clear();
  recvFrameBuffers_[1].clear();
  context_.reset();
  shm_.reset();
}

// ---- the queue -----------------------------------------------------------------
WorkPtr ProcessGroupGloo::enqueue(Descriptor descriptor, const std::string& summary, Milliseconds timeout,
                                  std::function<void(const Descriptor&, Deadline)> run) {
  std::lock_guard<std::mutex> lock(mutex_);
  descriptor.seq = nextSeq_++;
  auto work = std::make_shared<Work>(describeCall(rank_, size_, descriptor, summary), timeout);
  queue_.push_back(Task{descriptor, work, Clock::now() + timeout, timeout, std::move(run)});
  queuedCount_.fetch_add(1, std::memory_order_release);
  queued_.notify_one();
  return work;
}

void ProcessGroupGloo::workerLoop() {
  for (;;) {
    Task task;
    // Callers that wait on one collective usually queue the next at once.
    spinUntil([this] { return queuedCount_.load(std::memory_order_acquire) > 0; }, std::chrono::microseconds(50));
    {
      std::unique_lock<std::mutex> lock(mutex_);
      queued_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything queued has run
      task = std::move(queue_.front());
      queue_.pop_front();
      queuedCount_.fetch_sub(1, std::memory_order_relaxed);
    }
    std::exception_ptr error = broken_;
    if (error) {
      try {
        std::rethrow_exception(broken_);
      } catch (const std::exception& first) {
        error = std::make_exception_ptr(CollectiveError(task.work->description() +
                                                        " not run: the group failed earlier: " + first.what()));
      }
    } else {
      const auto started = Clock::now();
      try {
        task.run(task.descriptor, task.deadline);
        if (size_ > 1 && !shm_) {
          // The frame buffer of this collective is consumed: reuse it two ahead.
          postFrameReceives(task.descriptor.seq + 2);
          for (size_t i = 0; i < framePeers_.size(); ++i) sendFrameBuffer_->waitSend(remaining(task.deadline));
        }
      } catch (const CollectiveError&) {
        error = std::current_exception();
      } catch (const std::exception& e) {
        const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started);
        const bool timedOut = Clock::now() >= task.deadline;
        error = std::make_exception_ptr(CollectiveError(
            task.work->description() + (timedOut ? " timed out" : " failed") + " after " +
            std::to_string(waited.count()) + " ms (timeout " + std::to_string(task.timeout.count()) +
            " ms): " + e.what() +
            ". HINT: a peer rank may have died, or not called this collective; " + kRendezvousHelp));
      }
      if (error) {
        broken_ = error;
        if (shm_) shm_->markFailed();
      }
    }
    task.work->finish(error);
  }
}

// Frames of collective `seq` land in recvFrames_[seq % 2], rank p's at
// offset p * kFrameBytes. Posting them early means a peer's frame needs no
// "ready to receive" round trip before it flows.
void ProcessGroupGloo::postFrameReceives(uint64_t seq) {
  auto& buffers = recvFrameBuffers_[seq % 2];
  const uint64_t slot = slotFor(seq, kFramePhase);
  for (int peer : framePeersIn()) buffers[peer]->recv(peer, slot, 0, kFrameBytes);
}

std::vector<const uint8_t*> ProcessGroupGloo::exchangeFrames(const Descriptor& mine, const void* payload,
                                                             size_t payloadBytes, Deadline deadline) {
  DDP_CHECK(payloadBytes <= kSmallPayloadBytes, "frame payload too large");
  std::memcpy(sendFrame_.data(), &mine, sizeof(mine));
  if (payloadBytes) std::memcpy(sendFrame_.data() + sizeof(Descriptor), payload, payloadBytes);
  const uint64_t slot = slotFor(mine.seq, kFramePhase);
  for (int peer : framePeers_) sendFrameBuffer_->send(peer, slot, 0, kFrameBytes);
  uint8_t* frames = recvFrames_[mine.seq % 2].data();
  std::vector<const uint8_t*> payloads(size_, nullptr);
  for (int from : framePeersIn()) {
    recvFrameBuffers_[mine.seq % 2][from]->waitRecv(remaining(deadline));
    const uint8_t* frame = frames + static_cast<size_t>(from) * kFrameBytes;
    Descriptor theirs;
    std::memcpy(&theirs, frame, sizeof(theirs));
    checkPeerDescriptor(mine, theirs, from);
    payloads[from] = frame + sizeof(Descriptor);
  }
  return payloads;
}

void ProcessGroupGloo::checkPeerDescriptor(const Descriptor& mine, const Descriptor& theirs, int from) const {
  if (std::memcmp(&theirs, &mine, sizeof(mine)) != 0) {
    throw CollectiveError(describeCall(rank_, size_, mine, describePeer(mine)) + " does not match rank " +
                          std::to_string(from) + ", which called " + describePeer(theirs) +
                          ". HINT: every rank must call the same collectives in the same order with the same "
                          "dtype, element count and root");
  }
}

// ---- shared memory ---------------------------------------------------------------
// Each collective is a sequence of rounds over chunks of at most one slot;
// the first round carries every rank's descriptor, checked after its first
// step, before any rank reads a peer's payload.
void ProcessGroupGloo::shmBeginRound(const Descriptor& d, bool first) {
  static_assert(sizeof(Descriptor) <= ShmChannel::kDescriptorBytes, "descriptor must fit its shared slot");
  shm_->beginRound();
  if (first) std::memcpy(shm_->descriptor(rank_), &d, sizeof(d));
}

void ProcessGroupGloo::shmCheckDescriptors(const Descriptor& mine) {
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    Descriptor theirs;
    std::memcpy(&theirs, shm_->descriptor(p), sizeof(theirs));
    checkPeerDescriptor(mine, theirs, p);
  }
}

// ---- shared buffers ----------------------------------------------------------------
at::Tensor ProcessGroupGloo::allocateCommunicationBuffer(int64_t numel, const at::TensorOptions& options) {
  if (!shm_ || numel <= 0 || !options.device().is_cpu() || !reduceFnFor(c10::typeMetaToScalarType(options.dtype()))) {
    return ProcessGroup::allocateCommunicationBuffer(numel, options);
  }
  const size_t bytes = static_cast<size_t>(numel) * options.dtype().itemsize();
  std::shared_ptr<ShmBuffer> buffer;
  std::string why;
  try {
    buffer = shm_->allocateBuffer(*store_, bytes, options_.timeout, &why);
  } catch (const std::exception& e) {
    throw CollectiveError("[rank " + std::to_string(rank_) + "/" + std::to_string(size_) +
                          "] gloo: allocating a shared buffer of " + std::to_string(bytes) +
                          " bytes did not complete: " + e.what() + ". HINT: every rank must allocate the same "
                          "buffers in the same order; " + kRendezvousHelp);
  }
  if (!buffer) return ProcessGroup::allocateCommunicationBuffer(numel, options);  // every rank falls back
  void* base = buffer->base(rank_);
  {
    std::lock_guard<std::mutex> lock(sharedBuffersMutex_);
    for (auto it = sharedBuffers_.begin(); it != sharedBuffers_.end();) {
      it = it->second.expired() ? sharedBuffers_.erase(it) : std::next(it);
    }
    sharedBuffers_[base] = buffer;
  }
  // The tensor owns the mappings: it may outlive this group.
  return at::from_blob(base, {numel}, [buffer](void*) mutable { buffer.reset(); }, options);
}

std::shared_ptr<ShmBuffer> ProcessGroupGloo::sharedBufferOf(const at::Tensor& t) {
  if (!shm_ || !t.defined() || !t.is_cpu() || !t.is_contiguous()) return nullptr;
  std::lock_guard<std::mutex> lock(sharedBuffersMutex_);
  auto found = sharedBuffers_.find(t.data_ptr());
  if (found == sharedBuffers_.end()) return nullptr;
  auto buffer = found->second.lock();
  if (!buffer || buffer->bytes() != t.nbytes()) return nullptr;
  return buffer;
}

// On a shared buffer nothing is copied: after a first step (every rank's
// input is in place), rank r reduces part r of all ranks' buffers into rank
// 0's, in rank order (the same bits as shmAllreduce), and writes the result
// into every other rank's buffer; a second step ends it. Nobody touches a
// peer's buffer outside those two steps.
void ProcessGroupGloo::shmAllreduceInPlace(const Descriptor& d, ShmBuffer& buffer, at::Tensor& tensor, ReduceOp op,
                                           Deadline deadline) {
  const size_t es = tensor.element_size(), count = tensor.numel();
  shmBeginRound(d, true);
  shm_->step(deadline);
  shmCheckDescriptors(d);
  const size_t begin = count * rank_ / size_, end = count * (rank_ + 1) / size_;
  if (end > begin) {
    const ReduceFn reduce = reduceFnFor(tensor.scalar_type());
    uint8_t* acc = buffer.base(0) + begin * es;
    for (int p = 1; p < size_; ++p) reduce(acc, buffer.base(p) + begin * es, end - begin, static_cast<int>(op));
    if (op == ReduceOp::Avg) {
      divideInPlace(at::from_blob(acc, {static_cast<int64_t>(end - begin)}, tensor.options()), size_);
    }
    for (int p = 1; p < size_; ++p) std::memcpy(buffer.base(p) + begin * es, acc, (end - begin) * es);
  }
  shm_->step(deadline);
}

// One round per chunk of at most chunkElems of `count` elements (one round
// when count is 0): fill(at, len) writes this rank's slot, every rank steps,
// the first round checks the descriptors, then consume(at, len) reads.
template <typename Fill, typename Consume>
void ProcessGroupGloo::shmRounds(const Descriptor& d, size_t count, size_t chunkElems, Deadline deadline,
                                 Fill&& fill, Consume&& consume) {
  size_t at = 0;
  bool first = true;
  do {
    const size_t len = std::min(chunkElems, count - at);
    shmBeginRound(d, first);
    fill(at, len);
    shm_->step(deadline);
    if (first) shmCheckDescriptors(d);
    first = false;
    consume(at, len);
    at += len;
  } while (at < count);
}

// Rank r reduces the r-th part of each chunk into rank 0's slot, peers in
// rank order (the same bits on every rank); then every rank copies the
// whole reduced chunk out.
void ProcessGroupGloo::shmAllreduce(const Descriptor& d, at::Tensor& host, ReduceOp op, Deadline deadline) {
  const size_t es = host.element_size();
  uint8_t* data = static_cast<uint8_t*>(host.data_ptr());
  const ReduceFn reduce = reduceFnFor(host.scalar_type());
  shmRounds(
      d, host.numel(), shm_->slotBytes() / es, deadline,
      [&](size_t at, size_t len) {
        if (len) std::memcpy(shm_->slot(rank_), data + at * es, len * es);
      },
      [&](size_t at, size_t len) {
        const size_t begin = len * rank_ / size_, end = len * (rank_ + 1) / size_;
        if (end > begin) {
          uint8_t* acc = shm_->slot(0) + begin * es;
          for (int p = 1; p < size_; ++p) reduce(acc, shm_->slot(p) + begin * es, end - begin, static_cast<int>(op));
          if (op == ReduceOp::Avg) {
            divideInPlace(at::from_blob(acc, {static_cast<int64_t>(end - begin)}, host.options()), size_);
          }
        }
        shm_->step(deadline);  // every part reduced
        if (len) std::memcpy(data + at * es, shm_->slot(0), len * es);
      });
}

// Each rank lays its input blocks side by side in its slot, a chunk of each
// block per round; rank r reduces block r straight into its output.
void ProcessGroupGloo::shmReduceScatter(const Descriptor& d, const at::Tensor& in, at::Tensor& out, ReduceOp op,
                                        Deadline deadline) {
  const size_t es = in.element_size(), blockElems = out.numel();
  const uint8_t* src = static_cast<const uint8_t*>(in.data_ptr());
  uint8_t* dst = static_cast<uint8_t*>(out.data_ptr());
  const ReduceFn reduce = reduceFnFor(in.scalar_type());
  shmRounds(
      d, blockElems, std::max<size_t>(1, shm_->slotBytes() / (es * size_)), deadline,
      [&](size_t at, size_t len) {
        for (int b = 0; b < size_ && len; ++b) {
          std::memcpy(shm_->slot(rank_) + b * len * es, src + (b * blockElems + at) * es, len * es);
        }
      },
      [&](size_t at, size_t len) {
        if (!len) return;
        uint8_t* acc = dst + at * es;
        std::memcpy(acc, shm_->slot(0) + rank_ * len * es, len * es);
        for (int p = 1; p < size_; ++p) reduce(acc, shm_->slot(p) + rank_ * len * es, len, static_cast<int>(op));
        if (op == ReduceOp::Avg) divideInPlace(at::from_blob(acc, {static_cast<int64_t>(len)}, out.options()), size_);
      });
}

void ProcessGroupGloo::shmBroadcast(const Descriptor& d, at::Tensor& host, int root, Deadline deadline) {
  const size_t es = host.element_size();
  uint8_t* data = static_cast<uint8_t*>(host.data_ptr());
  shmRounds(
      d, host.numel(), shm_->slotBytes() / es, deadline,
      [&](size_t at, size_t len) {
        if (rank_ == root && len) std::memcpy(shm_->slot(root), data + at * es, len * es);
      },
      [&](size_t at, size_t len) {
        if (rank_ != root && len) std::memcpy(data + at * es, shm_->slot(root), len * es);
      });
}

void ProcessGroupGloo::shmAllgather(const Descriptor& d, const at::Tensor& in, at::Tensor& out, Deadline deadline) {
  const size_t es = in.element_size(), count = in.numel();
  const uint8_t* src = static_cast<const uint8_t*>(in.data_ptr());
  uint8_t* dst = static_cast<uint8_t*>(out.data_ptr());
  shmRounds(
      d, count, shm_->slotBytes() / es, deadline,
      [&](size_t at, size_t len) {
        if (len) std::memcpy(shm_->slot(rank_), src + at * es, len * es);
      },
      [&](size_t at, size_t len) {
        for (int p = 0; p < size_ && len; ++p) std::memcpy(dst + (p * count + at) * es, shm_->slot(p), len * es);
      });
}

// ---- the ring ------------------------------------------------------------------
// Ring reduce-scatter over `size_` blocks, pipelined in chunks: after it,
// rank r holds the reduction of block r. With thenAllgather the reduced
// blocks travel on around the ring (allreduce). Block b spans elements
// [b*count/n, (b+1)*count/n).
void ProcessGroupGloo::ringReduceScatter(uint8_t* data, size_t count, size_t elementSize, int reduceOp,
                                         int dtype, uint64_t seq, Deadline deadline, bool thenAllgather) {
  const int n = size_;
  const int right = (rank_ + 1) % n;
  const int left = (rank_ + n - 1) % n;
  const size_t bytes = count * elementSize;
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  uint8_t* tmp = scratch_.data();
  const ReduceFn reduce = reduceFnFor(static_cast<at::ScalarType>(dtype));
  const size_t chunkElems = std::max<size_t>(1, chunkBytes() / elementSize);

  auto mod = [n](int b) { return ((b % n) + n) % n; };
  auto blockBegin = [&](int b) { return static_cast<size_t>(b) * count / n; };
  auto blockEnd = [&](int b) { return static_cast<size_t>(b + 1) * count / n; };
  // Calls fn(offsetElems, lengthElems) for each chunk of block b, in order.
  auto forChunks = [&](int b, auto&& fn) {
    for (size_t at = blockBegin(b), end = blockEnd(b); at < end; at += chunkElems) {
      fn(at, std::min(chunkElems, end - at));
    }
  };

  auto scatterIn = context_->createUnboundBuffer(tmp, bytes);   // partial sums from the left
  auto scatterOut = context_->createUnboundBuffer(data, bytes);  // our partial sums, to the right
  std::unique_ptr<gloo::transport::UnboundBuffer> gatherIn, gatherOut;
  const uint64_t scatterSlot = slotFor(seq, kScatterPhase);
  const uint64_t gatherSlot = slotFor(seq, kGatherPhase);
  size_t scatterSends = 0, gatherSends = 0;

  // Post every receive first, so that no send waits for a "ready" round trip.
  for (int s = 0; s < n - 1; ++s) {
    forChunks(mod(rank_ - s - 2), [&](size_t at, size_t len) {
      scatterIn->recv(left, scatterSlot, at * elementSize, len * elementSize);
    });
  }
  if (thenAllgather) {
    gatherIn = context_->createUnboundBuffer(data, bytes);
    gatherOut = context_->createUnboundBuffer(data, bytes);
    for (int s = 0; s < n - 1; ++s) {
      forChunks(mod(rank_ - s - 1), [&](size_t at, size_t len) {
        gatherIn->recv(left, gatherSlot, at * elementSize, len * elementSize);
      });
    }
  }
  forChunks(mod(rank_ - 1), [&](size_t at, size_t len) {
    scatterOut->send(right, scatterSlot, at * elementSize, len * elementSize);
    ++scatterSends;
  });
  // Reduce-scatter: what arrives at step s is block r-s-2, which we send on
  // at step s+1, chunk by chunk, as soon as it is reduced.
  for (int s = 0; s < n - 1; ++s) {
    const bool last = s == n - 2;
    forChunks(mod(rank_ - s - 2), [&](size_t at, size_t len) {
      scatterIn->waitRecv(remaining(deadline));
      reduce(data + at * elementSize, tmp + at * elementSize, len, reduceOp);
      if (!last) {
        scatterOut->send(right, scatterSlot, at * elementSize, len * elementSize);
        ++scatterSends;
      } else if (thenAllgather) {
        gatherOut->send(right, gatherSlot, at * elementSize, len * elementSize);
        ++gatherSends;
      }
    });
  }
  // Allgather: what arrives at step s is block r-s-1, forwarded at step s+1.
  if (thenAllgather) {
    for (int s = 0; s < n - 1; ++s) {
      const bool last = s == n - 2;
      forChunks(mod(rank_ - s - 1), [&](size_t at, size_t len) {
        gatherIn->waitRecv(remaining(deadline));
        if (!last) {
          gatherOut->send(right, gatherSlot, at * elementSize, len * elementSize);
          ++gatherSends;
        }
      });
    }
  }
  for (size_t i = 0; i < scatterSends; ++i) scatterOut->waitSend(remaining(deadline));
  for (size_t i = 0; i < gatherSends; ++i) gatherOut->waitSend(remaining(deadline));
}

// ---- collectives ------------------------------------------------------------------
namespace {
std::string summarize(const at::Tensor& t, const char* extra = nullptr) {
  std::string s = std::to_string(t.numel()) + " elements, " + dtypeName(t);
  if (extra) s += std::string(", ") + extra;
  return s;
}
}  // namespace

WorkPtr ProcessGroupGloo::allreduce(at::Tensor& tensor, const AllreduceOptions& opts) {
  requireSupported(tensor, "allreduce");
  Descriptor d;
  d.op = kAllreduce;
  d.dtype = static_cast<uint32_t>(tensor.scalar_type());
  d.numel = tensor.numel();
  d.reduceOp = static_cast<int32_t>(opts.op);
  const auto timeout = resolveTimeout(opts.timeout);
  std::shared_ptr<ShmBuffer> shared = sharedBufferOf(tensor);
  if (shared) d.sharedBuffer = shared->id() + 1;
  at::Tensor target = tensor;
  return enqueue(d, summarize(tensor, reduceOpName(opts.op)), timeout,
                 [this, target, shared, op = opts.op](const Descriptor& d, Deadline deadline) mutable {
                   if (size_ == 1) return;
                   if (shared) {
                     shmAllreduceInPlace(d, *shared, target, op, deadline);
                     return;
                   }
                   at::Tensor host = hostView(target);
                   const size_t bytes = host.nbytes();
                   if (shm_) {
                     shmAllreduce(d, host, op, deadline);  // divides for Avg itself
                     if (!host.is_same(target)) target.copy_(host);
                     return;
                   }
                   if (smallPath(bytes)) {
                     // Every rank folds the same frames in rank order: identical bits everywhere.
                     auto frames = exchangeFrames(d, host.data_ptr(), bytes, deadline);
                     if (bytes == 0) return;
                     std::vector<uint8_t> mine(static_cast<uint8_t*>(host.data_ptr()),
                                               static_cast<uint8_t*>(host.data_ptr()) + bytes);
                     frames[rank_] = mine.data();
                     const ReduceFn reduce = reduceFnFor(host.scalar_type());
                     uint8_t* out = static_cast<uint8_t*>(host.data_ptr());
                     std::memcpy(out, frames[0], bytes);
                     for (int p = 1; p < size_; ++p) reduce(out, frames[p], host.numel(), static_cast<int>(op));
                   } else {
                     exchangeFrames(d, nullptr, 0, deadline);
                     ringReduceScatter(static_cast<uint8_t*>(host.data_ptr()), host.numel(), host.element_size(),
                                     static_cast<int>(op), static_cast<int>(host.scalar_type()), d.seq, deadline,
                                     /*thenAllgather=*/true);
                   }
                   if (op == ReduceOp::Avg) divideInPlace(host, size_);
                   if (!host.is_same(target)) target.copy_(host);
                 });
}

WorkPtr ProcessGroupGloo::reduceScatter(const at::Tensor& input, at::Tensor& output,
                                        const ReduceScatterOptions& opts) {
  requireSupported(input, "reduce_scatter");
  if (input.numel() != output.numel() * size_ || input.scalar_type() != output.scalar_type()) {
    throw UsageError("gloo reduce_scatter: input must hold world size (" + std::to_string(size_) +
                     ") x output elements of the same dtype; got input " + summarize(input) + ", output " +
                     summarize(output));
  }
  Descriptor d;
  d.op = kReduceScatter;
  d.dtype = static_cast<uint32_t>(input.scalar_type());
  d.numel = input.numel();
  d.reduceOp = static_cast<int32_t>(opts.op);
  at::Tensor in = input, out = output;
  return enqueue(d, summarize(input, reduceOpName(opts.op)), resolveTimeout(opts.timeout),
                 [this, in, out, op = opts.op](const Descriptor& d, Deadline deadline) mutable {
                   at::Tensor src = hostView(in);
                   const size_t bytes = src.nbytes(), sliceBytes = bytes / size_;
                   const size_t elementSize = src.element_size();
                   // Reduce straight into the output when it is a contiguous host
                   // tensor: a fresh buffer per call costs page faults at every size.
                   at::Tensor outHost = hostView(out);
                   at::Tensor mine = outHost.view({-1});
                   if (size_ == 1) {
                     mine.copy_(src.view({-1}));
                   } else if (shm_) {
                     shmReduceScatter(d, src, mine, op, deadline);  // divides for Avg itself
                     if (!outHost.is_same(out)) out.copy_(outHost);
                     return;
                   } else if (smallPath(bytes)) {
                     auto frames = exchangeFrames(d, src.data_ptr(), bytes, deadline);
                     frames[rank_] = static_cast<const uint8_t*>(src.data_ptr());
                     if (sliceBytes > 0) {
                       const ReduceFn reduce = reduceFnFor(src.scalar_type());
                       uint8_t* acc = static_cast<uint8_t*>(mine.data_ptr());
                       std::memcpy(acc, frames[0] + rank_ * sliceBytes, sliceBytes);
                       for (int p = 1; p < size_; ++p) {
                         reduce(acc, frames[p] + rank_ * sliceBytes, out.numel(), static_cast<int>(op));
                       }
                     }
                   } else {
                     exchangeFrames(d, nullptr, 0, deadline);
                     // The ring reduces in place; work on a reused copy of the input.
                     if (reduceScatterIn_.size() < bytes) reduceScatterIn_.resize(bytes);
                     std::memcpy(reduceScatterIn_.data(), src.data_ptr(), bytes);
                     ringReduceScatter(reduceScatterIn_.data(), src.numel(), elementSize, static_cast<int>(op),
                                       static_cast<int>(src.scalar_type()), d.seq, deadline,
                                       /*thenAllgather=*/false);
                     std::memcpy(mine.data_ptr(), reduceScatterIn_.data() + rank_ * sliceBytes, sliceBytes);
                   }
                   if (op == ReduceOp::Avg) divideInPlace(mine, size_);
                   if (!outHost.is_same(out)) out.copy_(outHost);
                 });
}

WorkPtr ProcessGroupGloo::broadcast(at::Tensor& tensor, const BroadcastOptions& opts) {
  requireSupported(tensor, "broadcast");
  if (opts.root < 0 || opts.root >= size_) {
    throw UsageError("gloo broadcast: root " + std::to_string(opts.root) + " is outside world size " +
                     std::to_string(size_));
  }
  Descriptor d;
  d.op = kBroadcast;
  d.dtype = static_cast<uint32_t>(tensor.scalar_type());
  d.numel = tensor.numel();
  d.root = opts.root;
  at::Tensor target = tensor;
  return enqueue(d, summarize(tensor, ("root " + std::to_string(opts.root)).c_str()), resolveTimeout(opts.timeout),
                 [this, target, root = opts.root](const Descriptor& d, Deadline deadline) mutable {
                   if (size_ == 1) return;
                   at::Tensor host = hostView(target);
                   const size_t bytes = host.nbytes();
                   if (shm_) {
                     shmBroadcast(d, host, root, deadline);
                     if (!host.is_same(target)) target.copy_(host);
                     return;
                   }
                   if (smallPath(bytes)) {
                     auto frames = exchangeFrames(d, rank_ == root ? host.data_ptr() : nullptr,
                                                  rank_ == root ? bytes : 0, deadline);
                     if (rank_ != root && bytes) std::memcpy(host.data_ptr(), frames[root], bytes);
                     if (!host.is_same(target)) target.copy_(host);
                     return;
                   }
                   exchangeFrames(d, nullptr, 0, deadline);
                   gloo::BroadcastOptions bo(context_);
                   bo.setOutput(static_cast<uint8_t*>(host.data_ptr()), host.nbytes());
                   bo.setRoot(root);
                   bo.setTag(static_cast<uint32_t>(d.seq));
                   bo.setTimeout(remaining(deadline));
                   gloo::broadcast(bo);
                   if (!host.is_same(target)) target.copy_(host);
                 });
}

WorkPtr ProcessGroupGloo::allgather(const at::Tensor& input, at::Tensor& output, const AllgatherOptions& opts) {
  requireSupported(input, "allgather");
  if (output.numel() != input.numel() * size_ || input.scalar_type() != output.scalar_type()) {
    throw UsageError("gloo allgather: output must hold world size (" + std::to_string(size_) +
                     ") x input elements of the same dtype; got input " + summarize(input) + ", output " +
                     summarize(output));
  }
  Descriptor d;
  d.op = kAllgather;
  d.dtype = static_cast<uint32_t>(input.scalar_type());
  d.numel = input.numel();
  at::Tensor in = input, out = output;
  return enqueue(d, summarize(input), resolveTimeout(opts.timeout),
                 [this, in, out](const Descriptor& d, Deadline deadline) mutable {
                   at::Tensor src = hostView(in);
                   at::Tensor dst = hostView(out);
                   const size_t bytes = src.nbytes();
                   if (size_ == 1) {
                     if (bytes > 0) dst.view({-1}).copy_(src.view({-1}));
                   } else if (shm_) {
                     shmAllgather(d, src, dst, deadline);
                   } else if (smallPath(bytes)) {
                     auto frames = exchangeFrames(d, src.data_ptr(), bytes, deadline);
                     frames[rank_] = static_cast<const uint8_t*>(src.data_ptr());
                     uint8_t* outBytes = static_cast<uint8_t*>(dst.data_ptr());
                     for (int p = 0; p < size_ && bytes; ++p) std::memcpy(outBytes + p * bytes, frames[p], bytes);
                   } else {
                     exchangeFrames(d, nullptr, 0, deadline);
                     gloo::AllgatherOptions ao(context_);
                     ao.setInput(static_cast<uint8_t*>(src.data_ptr()), src.nbytes());
                     ao.setOutput(static_cast<uint8_t*>(dst.data_ptr()), dst.nbytes());
                     ao.setTag(static_cast<uint32_t>(d.seq));
                     ao.setTimeout(remaining(deadline));
                     gloo::allgather(ao);
                   }
                   if (!dst.is_same(out)) out.copy_(dst);
                 });
}

WorkPtr ProcessGroupGloo::barrier(const BarrierOptions& opts) {
  Descriptor d;
  d.op = kBarrier;
  // With every rank framing every other, the frame exchange is the barrier;
  // beyond kAllToAllMaxRanks frames go around the ring, so Gloo's barrier
  // follows.
  return enqueue(d, "no data", resolveTimeout(opts.timeout), [this](const Descriptor& d, Deadline deadline) {
    if (size_ == 1) return;
    if (shm_) {
      shmBeginRound(d, true);
      shm_->step(deadline);
      shmCheckDescriptors(d);
      return;
    }
    exchangeFrames(d, nullptr, 0, deadline);
    if (size_ > kAllToAllMaxRanks) {
      gloo::BarrierOptions bo(context_);
      bo.setTag(static_cast<uint32_t>(d.seq));
      bo.setTimeout(remaining(deadline));
      gloo::barrier(bo);
    }
  });
}

void registerGlooBackend(BackendRegistry& registry) {
  registry.add("gloo", [](std::shared_ptr<Store> store, int rank, int size, const ProcessGroupOptions& options) {
    return std::make_shared<ProcessGroupGloo>(std::move(store), rank, size, options);
  });
}

}  // namespace ddp
