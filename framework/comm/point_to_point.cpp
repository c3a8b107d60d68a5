// PointToPoint (point_to_point.hpp): a listener, one connection per
// (sender, receiver) pair made by the sender, and one I/O thread that
// moves every message with non-blocking sockets.
#include "framework/comm/point_to_point.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "framework/comm/links.hpp"
#include "framework/comm/process_group.hpp"
#include "framework/core/errors.hpp"
#include "framework/core/system.hpp"
#include "framework/store/store.hpp"
#include "framework/store/tcp/socket.hpp"

namespace ddp {
// Named, not anonymous: PointToPoint::Impl (external linkage) holds them.
namespace p2p_detail {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kP2pMagic = 0x50325044;  // "DP2P"

struct P2pHello {
  uint32_t magic;
  int32_t rank;
  char nonce[16];
};
struct P2pHeader {
  uint32_t magic;
  int32_t tag;
  int32_t dtype;
  int32_t reserved;
  int64_t numel;
};

class P2pRecvWork : public Work {
 public:
  using Work::Work;
  int sourceRank() const override { return source.load(); }
  std::atomic<int> source{-1};
};

}  // namespace p2p_detail

struct PointToPoint::Impl {
  using Clock = p2p_detail::Clock;
  using P2pHello = p2p_detail::P2pHello;
  using P2pHeader = p2p_detail::P2pHeader;
  using P2pRecvWork = p2p_detail::P2pRecvWork;
  static constexpr uint32_t kP2pMagic = p2p_detail::kP2pMagic;
  struct SendOp {
    int tag;
    P2pHeader header;
    at::Tensor payload;  // contiguous CPU: the caller's tensor itself where it is one
    size_t sent = 0;     // of the header and payload together
    size_t total() const { return sizeof(P2pHeader) + payload.nbytes(); }
    WorkPtr work;
    Clock::time_point deadline;
    Milliseconds timeout;
  };
  struct RecvOp {
    int src, tag;
    at::Tensor target, staging;  // staging: contiguous CPU, what the bytes go into
    std::shared_ptr<P2pRecvWork> work;
    Clock::time_point deadline;
    Milliseconds timeout;
  };
  struct Message {  // arrived before any recv asked for it
    int src, tag, dtype;
    int64_t numel;
    std::string bytes;
  };
  struct Outgoing {
    int fd = -1;
    bool connecting = false;
    std::deque<std::shared_ptr<SendOp>> queue;
  };
  struct Incoming {
    int fd = -1;
    int src = -1;  // known once the hello has arrived
    std::string head;  // bytes of the hello or header so far
    bool inMessage = false;
    P2pHeader header{};
    std::shared_ptr<RecvOp> into;  // the recv being filled, or null: into `spare`
    bool direct = false;           // into `into`'s staging (it fits), else into `spare`
    std::string spare;
    size_t got = 0;
  };

  std::shared_ptr<Store> store;
  const int rank, size;
  const std::string address, label;
  std::mutex mutex;
  bool started = false, stopping = false;
  bool closed = false;  // shutdown(): every later send or recv fails at once
  int listener = -1, wakeRead = -1, wakeWrite = -1;
  std::string nonce;
  std::thread io;
  std::vector<std::thread> connectors;
  std::map<int, Outgoing> out;
  std::list<Incoming> in;
  std::list<std::shared_ptr<RecvOp>> posted;
  std::list<Message> unexpected;
  std::vector<bool> closedBy;  // a peer whose connection to us ended
  std::function<void(const std::string&, bool)> failureHook;

  Impl(std::shared_ptr<Store> s, int r, int n, std::string a, std::string l)
      : store(std::move(s)), rank(r), size(n), address(std::move(a)), label(std::move(l)), closedBy(n, false) {}

  // Fails `work`, after telling the failure hook (setFailureHook).
  void failWork(const WorkPtr& work, std::exception_ptr error, bool timedOut = false) {
    if (failureHook) {
      try {
        std::rethrow_exception(error);
      } catch (const std::exception& e) {
        failureHook(e.what(), timedOut);
      }
    }
    work->finish(error);
  }

  void wake() {
    const char b = 1;
    if (wakeWrite >= 0) (void)!::write(wakeWrite, &b, 1);
  }

  // Under mutex.
  void startLocked() {
    if (started) return;
    tcpstore::AddrInfoList here;
    std::string error = tcpstore::resolve(address, 0, /*passive=*/true, &here);
    if (!error.empty()) fail<CollectiveError>("{} send/recv: cannot resolve {}: {}", label, address, error);
    int err = 0;
    listener = tcpstore::listenOn(*here.list, &err);
    if (listener < 0) fail<CollectiveError>("{} send/recv: cannot listen on {}: {}", label, address, errnoText(err));
    int pipe[2];
    if (::pipe2(pipe, O_CLOEXEC | O_NONBLOCK) != 0) fail<CollectiveError>("{} send/recv: pipe: {}", label, errnoText(errno));
    wakeRead = pipe[0];
    wakeWrite = pipe[1];
    nonce = randomHex(8);
    store->setString(fmt::format("p2p/{}", rank), fmt::format("{} {} {}", tcpstore::boundPort(listener), nonce, address));
    started = true;
    io = std::thread([this] { loop(); });
  }

  std::string describe(const char* op, int peer, int tag, const at::Tensor& t) const {
    return fmt::format("{} {} {} rank {} (tag {}, {} x {})", label, op, std::string(op) == "send" ? "to" : "from",
                       peer < 0 ? std::string("any") : std::to_string(peer), tag, t.numel(), dtypeName(t));
  }

  // A connector thread: the receiver's address, a connection, the hello.
  void connect(int dst, Clock::time_point deadline) {
    int fd = -1;
    std::string error;
    try {
      const std::string key = fmt::format("p2p/{}", dst);
      while (!store->check({key})) {
        {
          std::lock_guard<std::mutex> lock(mutex);
          if (stopping) return;
        }
        if (Clock::now() >= deadline) throw std::runtime_error("it did not start receiving (no address published)");
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      std::istringstream published(store->getString(key));
      uint16_t port = 0;
      std::string theirNonce, theirAddress;
      published >> port >> theirNonce >> theirAddress;
      tcpstore::AddrInfoList there;
      error = tcpstore::resolve(theirAddress, port, /*passive=*/false, &there);
      if (error.empty()) fd = tcpstore::connectTo(*there.list, deadline, &error);
      if (fd < 0) throw std::runtime_error(error);
      P2pHello hello{kP2pMagic, rank, {}};
      std::memcpy(hello.nonce, theirNonce.data(), std::min(theirNonce.size(), sizeof hello.nonce));
      tcpstore::sendAll(fd, std::string(reinterpret_cast<const char*>(&hello), sizeof hello), deadline);
      ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    } catch (const std::exception& e) {
      if (fd >= 0) ::close(fd);
      fd = -1;
      error = e.what();
    }
    std::lock_guard<std::mutex> lock(mutex);
    Outgoing& o = out[dst];
    o.connecting = false;
    if (fd >= 0 && !stopping) {
      o.fd = fd;
    } else {
      if (fd >= 0) ::close(fd);
      for (auto& op : o.queue) {
        failWork(op->work, std::make_exception_ptr(CollectiveError(
            fmt::format("{} send to rank {} (tag {}): cannot connect: {}", label, dst, op->tag, error))));
      }
      o.queue.clear();
    }
    wake();
  }

  // Under mutex: sends what the kernel takes now of `op`, from where it
  // left off (header and payload in one sendmsg).
  static ssize_t sendSomeOf(int fd, SendOp& op, std::string* why) {
    iovec parts[2];
    int count = 0;
    const size_t head = sizeof(P2pHeader);
    if (op.sent < head) parts[count++] = {reinterpret_cast<char*>(&op.header) + op.sent, head - op.sent};
    const size_t at = op.sent > head ? op.sent - head : 0;
    if (at < op.payload.nbytes()) {
      parts[count++] = {static_cast<char*>(op.payload.data_ptr()) + at, op.payload.nbytes() - at};
    }
    return sendSomeParts(fd, parts, count, why);
  }

  // Under mutex: a recv posted, or a message complete: match them.
  void deliverLocked(RecvOp& r, int src, int dtype, int64_t numel, const char* data) {
    if (dtype != static_cast<int>(r.staging.scalar_type()) || numel != r.staging.numel()) {
      failWork(r.work, std::make_exception_ptr(CollectiveError(fmt::format(
          "{} recv from rank {} (tag {}): rank {} sent {} x {}, this recv expects {} x {}", label, src, r.tag, src,
          numel, c10::toString(static_cast<at::ScalarType>(dtype)), r.staging.numel(), dtypeName(r.staging)))));
      return;
    }
    if (data && numel > 0) std::memcpy(r.staging.data_ptr(), data, r.staging.nbytes());
    finishRecv(r, src);
  }
  void finishRecv(RecvOp& r, int src) {
    std::exception_ptr error;
    try {
      if (!r.staging.is_same(r.target)) r.target.copy_(r.staging.view(r.target.sizes()));
    } catch (...) {
      error = std::current_exception();
    }
    r.work->source = src;
    if (error) {
      failWork(r.work, error);
    } else {
      r.work->finish();
    }
  }
  static bool matches(const RecvOp& r, int src, int tag) { return r.tag == tag && (r.src == kAnySourceRank || r.src == src); }

  void failLocked(std::list<std::shared_ptr<RecvOp>>::iterator it, const std::string& why, bool timedOut = false) {
    failWork((*it)->work, std::make_exception_ptr(CollectiveError(why)), timedOut);
    posted.erase(it);
  }

  // Reads what `c` has; false when the connection is done with.
  bool readFrom(Incoming& c) {
    char buffer[1 << 16];
    while (true) {
      std::string why;
      if (!c.inMessage) {
        const size_t need = (c.src < 0 ? sizeof(P2pHello) : sizeof(P2pHeader)) - c.head.size();
        const ssize_t n = recvSome(c.fd, buffer, need, &why);
        if (n == 0) return true;
        if (n < 0) return false;
        c.head.append(buffer, static_cast<size_t>(n));
        if (c.head.size() < (c.src < 0 ? sizeof(P2pHello) : sizeof(P2pHeader))) continue;
        if (c.src < 0) {
          P2pHello h;
          std::memcpy(&h, c.head.data(), sizeof h);
          if (h.magic != kP2pMagic || h.rank < 0 || h.rank >= size || std::string(h.nonce, nonce.size()) != nonce) {
            return false;  // a stranger
          }
          c.src = h.rank;
          c.head.clear();
          continue;
        }
        std::memcpy(&c.header, c.head.data(), sizeof c.header);
        c.head.clear();
        if (c.header.magic != kP2pMagic || c.header.numel < 0) return false;
        c.inMessage = true;
        c.got = 0;
        std::lock_guard<std::mutex> lock(mutex);
        c.into.reset();
        for (auto it = posted.begin(); it != posted.end(); ++it) {
          if (matches(**it, c.src, c.header.tag)) {
            c.into = *it;
            posted.erase(it);
            break;
          }
        }
        const int64_t bytes = c.header.numel * int64_t(c10::elementSize(static_cast<at::ScalarType>(c.header.dtype)));
        c.direct = c.into && c.header.dtype == int(c.into->staging.scalar_type()) &&
                   c.header.numel == c.into->staging.numel();
        if (!c.direct) c.spare.assign(static_cast<size_t>(bytes), '\0');
      }
      char* dst;
      size_t total;
      const bool direct = c.direct;
      if (direct) {
        dst = static_cast<char*>(c.into->staging.data_ptr());
        total = c.into->staging.nbytes();
      } else {
        dst = c.spare.data();
        total = c.spare.size();
      }
      if (c.got < total) {
        const ssize_t n = recvSome(c.fd, dst + c.got, total - c.got, &why);
        if (n == 0) return true;
        if (n < 0) return false;
        c.got += static_cast<size_t>(n);
        if (c.got < total) continue;
      }
      // A whole message.
      std::lock_guard<std::mutex> lock(mutex);
      if (direct) {
        finishRecv(*c.into, c.src);
      } else if (c.into) {
        deliverLocked(*c.into, c.src, c.header.dtype, c.header.numel, c.spare.data());  // fails it: wrong size
      } else {
        // A recv for it may have been posted while it arrived.
        auto match = posted.begin();
        while (match != posted.end() && !matches(**match, c.src, c.header.tag)) ++match;
        if (match != posted.end()) {
          std::shared_ptr<RecvOp> r = *match;
          posted.erase(match);
          deliverLocked(*r, c.src, c.header.dtype, c.header.numel, c.spare.data());
        } else {
          unexpected.push_back({c.src, c.header.tag, c.header.dtype, c.header.numel, std::move(c.spare)});
        }
      }
      c.spare.clear();
      c.into.reset();
      c.inMessage = false;
    }
  }

  void loop() {
    std::vector<pollfd> fds;
    while (true) {
      Clock::time_point next = Clock::now() + std::chrono::seconds(1);
      fds.clear();
      std::vector<int> outFds;
      {
        std::lock_guard<std::mutex> lock(mutex);
        if (stopping) break;
        // Timeouts.
        const auto now = Clock::now();
        for (auto it = posted.begin(); it != posted.end();) {
          if ((*it)->deadline <= now) {
            const auto& r = **it;
            failLocked(it++,
                       fmt::format("{} timed out after {} ms", describe("recv", r.src, r.tag, r.staging),
                                   r.timeout.count()),
                       /*timedOut=*/true);
          } else {
            next = std::min(next, (*it)->deadline);
            ++it;
          }
        }
        for (auto& [dst, o] : out) {
          while (!o.queue.empty() && o.queue.front()->deadline <= now) {
            auto op = o.queue.front();
            o.queue.pop_front();
            failWork(op->work, std::make_exception_ptr(CollectiveError(
                fmt::format("{} send to rank {} (tag {}) timed out after {} ms", label, dst, op->tag, op->timeout.count()))),
                     /*timedOut=*/true);
            if (op->sent > 0) {  // cut mid-message: the stream cannot go on; the next send connects anew
              ::close(o.fd);
              o.fd = -1;
            }
          }
          if (!o.queue.empty()) next = std::min(next, o.queue.front()->deadline);
          if (o.fd >= 0 && !o.queue.empty()) {
            fds.push_back({o.fd, POLLOUT, 0});
            outFds.push_back(dst);
          }
        }
      }
      fds.push_back({wakeRead, POLLIN, 0});
      fds.push_back({listener, POLLIN, 0});
      for (auto& c : in) fds.push_back({c.fd, POLLIN, 0});
      pollUntil(fds.data(), fds.size(), next);
      char drain[64];
      while (::read(wakeRead, drain, sizeof drain) > 0) {
      }
      // Sends.
      for (size_t k = 0; k < outFds.size(); ++k) {
        if (!(fds[k].revents & (POLLOUT | POLLERR | POLLHUP))) continue;
        std::lock_guard<std::mutex> lock(mutex);
        Outgoing& o = out[outFds[k]];
        while (!o.queue.empty()) {
          auto op = o.queue.front();
          std::string why;
          const ssize_t n = sendSomeOf(o.fd, *op, &why);
          if (n < 0) {
            for (auto& q : o.queue) {
              failWork(q->work, std::make_exception_ptr(CollectiveError(fmt::format(
                  "{} send to rank {} (tag {}): the connection broke: {}", label, outFds[k], q->tag, why))));
            }
            o.queue.clear();
            ::close(o.fd);
            o.fd = -1;
            break;
          }
          if (n == 0) break;
          op->sent += static_cast<size_t>(n);
          if (op->sent < op->total()) break;
          o.queue.pop_front();
          op->work->finish();
        }
      }
      // New connections.
      if (fds[outFds.size() + 1].revents & POLLIN) {
        const int fd = ::accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) in.push_back(Incoming{fd});
      }
      // Incoming data.
      size_t k = outFds.size() + 2;
      for (auto it = in.begin(); it != in.end(); ++k) {
        const bool ready = k < fds.size() && fds[k].fd == it->fd && (fds[k].revents & (POLLIN | POLLERR | POLLHUP));
        if (!ready || readFrom(*it)) {
          ++it;
          continue;
        }
        // Closed: the recvs that wait on this sender fail now.
        const int src = it->src;
        ::close(it->fd);
        std::lock_guard<std::mutex> lock(mutex);
        if (src >= 0) {
          closedBy[static_cast<size_t>(src)] = true;
          if (it->into) {
            failWork(it->into->work, std::make_exception_ptr(CollectiveError(fmt::format(
                "{}: rank {} closed its connection in the middle of a message (it died?)",
                describe("recv", src, it->into->tag, it->into->staging), src))));
          }
          for (auto p = posted.begin(); p != posted.end();) {
            if ((*p)->src == src) {
              const auto& r = **p;
              failLocked(p++, fmt::format("{}: rank {} closed its connection (it died, or destroyed its group)",
                                          describe("recv", r.src, r.tag, r.staging), src));
            } else {
              ++p;
            }
          }
        }
        it = in.erase(it);
      }
    }
  }
};

PointToPoint::PointToPoint(std::shared_ptr<Store> store, int rank, int size, std::string address, std::string label)
    : impl_(std::make_unique<Impl>(std::move(store), rank, size, std::move(address), std::move(label))) {}

PointToPoint::~PointToPoint() { shutdown(); }

void PointToPoint::setFailureHook(std::function<void(const std::string& why, bool timedOut)> hook) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->failureHook = std::move(hook);
}

void PointToPoint::shutdown() {
  Impl& s = *impl_;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (s.closed) return;
    s.closed = true;
    s.stopping = true;
  }
  s.wake();
  if (s.io.joinable()) s.io.join();
  for (auto& t : s.connectors) t.join();
  std::lock_guard<std::mutex> lock(s.mutex);
  const auto gone = std::make_exception_ptr(CollectiveError(s.label + " send/recv: the group was destroyed"));
  for (auto& r : s.posted) r->work->finish(gone);
  s.posted.clear();
  for (auto& [dst, o] : s.out) {
    for (auto& op : o.queue) op->work->finish(gone);
    o.queue.clear();
    if (o.fd >= 0) ::close(o.fd);
    o.fd = -1;
  }
  for (auto& c : s.in) {
    if (c.into) c.into->work->finish(gone);
    ::close(c.fd);
  }
  s.in.clear();
  for (int* fd : {&s.listener, &s.wakeRead, &s.wakeWrite}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
}

WorkPtr PointToPoint::send(const at::Tensor& tensor, int dst, int tag, std::chrono::milliseconds timeout) {
  Impl& s = *impl_;
  if (dst < 0 || dst >= s.size || dst == s.rank) {
    fail<UsageError>("{} send: destination {} is not another rank of the group's {}", s.label, dst, s.size);
  }
  auto op = std::make_shared<Impl::SendOp>();
  op->tag = tag;
  op->timeout = timeout;
  op->deadline = Impl::Clock::now() + timeout;
  op->work = std::make_shared<Work>(s.describe("send", dst, tag, tensor), timeout);
  op->payload = tensor.detach().to(at::kCPU).contiguous();
  op->header = {Impl::kP2pMagic, tag, static_cast<int32_t>(op->payload.scalar_type()), 0, op->payload.numel()};
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.closed) {
    op->work->finish(std::make_exception_ptr(CollectiveError(s.label + " send: the group is being destroyed")));  // closed: no hook
    return op->work;
  }
  s.startLocked();
  Impl::Outgoing& o = s.out[dst];
  if (o.fd >= 0 && o.queue.empty()) {
    // Nothing ahead of it: what the kernel takes now goes from this thread,
    // sparing the I/O thread's wake-up (all of a small message). A failure
    // is left to the I/O thread, which cleans up after it.
    std::string why;
    ssize_t n;
    while (op->sent < op->total() && (n = Impl::sendSomeOf(o.fd, *op, &why)) > 0) op->sent += static_cast<size_t>(n);
    if (op->sent == op->total()) {
      op->work->finish();
      return op->work;
    }
  }
  o.queue.push_back(op);
  if (o.fd < 0 && !o.connecting) {  // the first send to dst, or one after a broken connection
    o.connecting = true;
    s.connectors.emplace_back([&s, dst, deadline = op->deadline] { s.connect(dst, deadline); });
  }
  s.wake();
  return op->work;
}

WorkPtr PointToPoint::recv(at::Tensor& tensor, int src, int tag, std::chrono::milliseconds timeout) {
  Impl& s = *impl_;
  if (src != kAnySourceRank && (src < 0 || src >= s.size || src == s.rank)) {
    fail<UsageError>("{} recv: source {} is not another rank of the group's {} (or kAnySourceRank)", s.label, src, s.size);
  }
  auto op = std::make_shared<Impl::RecvOp>();
  op->src = src;
  op->tag = tag;
  op->target = tensor;
  op->staging = tensor.device().is_cpu() && tensor.is_contiguous() ? tensor : at::empty({tensor.numel()}, tensor.options().device(at::kCPU));
  op->timeout = timeout;
  op->deadline = Impl::Clock::now() + timeout;
  op->work = std::make_shared<Impl::P2pRecvWork>(s.describe("recv", src, tag, tensor), timeout);
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.closed) {
    op->work->finish(std::make_exception_ptr(CollectiveError(s.label + " recv: the group is being destroyed")));  // closed: no hook
    return op->work;
  }
  s.startLocked();
  // A message that came first.
  for (auto it = s.unexpected.begin(); it != s.unexpected.end(); ++it) {
    if (Impl::matches(*op, it->src, it->tag)) {
      s.deliverLocked(*op, it->src, it->dtype, it->numel, it->bytes.data());
      s.unexpected.erase(it);
      return op->work;
    }
  }
  if (src != kAnySourceRank && s.closedBy[static_cast<size_t>(src)]) {
    s.failWork(op->work, std::make_exception_ptr(CollectiveError(
        fmt::format("{}: rank {} has closed its connection (it died, or destroyed its group)",
                    s.describe("recv", src, tag, tensor), src))));
    return op->work;
  }
  s.posted.push_back(op);
  s.wake();
  return op->work;
}


void exchangeBlocks(PointToPoint& p2p, int rank, int size, const std::vector<at::Tensor>& sends,
                    const std::vector<at::Tensor>& recvs, int tag, std::chrono::steady_clock::time_point deadline,
                    const std::string& label) {
  const auto left = [&] {
    return std::max(Milliseconds(1),
                    std::chrono::duration_cast<Milliseconds>(deadline - std::chrono::steady_clock::now()));
  };
  struct Pending {
    WorkPtr work;
    int peer;
    bool receiving;
  };
  std::vector<Pending> pending;
  std::string first;
  try {
    for (int k = 1; k < size; ++k) {
      const int to = (rank + k) % size, from = (rank - k + size) % size;
      at::Tensor in = recvs[static_cast<size_t>(from)];
      if (in.defined()) pending.push_back({p2p.recv(in, from, tag, left()), from, true});
      const at::Tensor& out = sends[static_cast<size_t>(to)];
      if (out.defined()) pending.push_back({p2p.send(out, to, tag, left()), to, false});
    }
  } catch (const std::exception& e) {  // posting failed: what was posted is still waited for
    first = fmt::format("{}: {}", label, e.what());
  }
  // Every Work ends by its deadline: all are waited for, so that none still
  // writes into an output (or reads an input) once this returns.
  for (const Pending& p : pending) {
    try {
      p.work->wait();
    } catch (const std::exception& e) {
      if (!first.empty()) continue;
      first = p.receiving ? fmt::format("{}: the block from rank {} ({} elements expected): {}", label, p.peer,
                                        recvs[static_cast<size_t>(p.peer)].numel(), e.what())
                          : fmt::format("{}: the block to rank {}: {}", label, p.peer, e.what());
    }
  }
  if (!first.empty()) throw CollectiveError(first);
}

}  // namespace ddp
