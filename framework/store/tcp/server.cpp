#include "framework/store/tcp/server.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <deque>
#include <map>
#include <set>
#include <thread>
#include <unordered_map>
#include <vector>

#include "framework/core/errors.hpp"
#include "framework/core/log.hpp"
#include "framework/core/system.hpp"
#include "framework/store/store_util.hpp"
#include "framework/store/tcp/auth.hpp"
#include "framework/store/tcp/socket.hpp"
#include "framework/store/tcp/wire.hpp"

namespace ddp::tcpstore {

namespace {

// A peer that connects but sends no handshake is dropped after this long, so
// port scanners and stuck half-open connections do not pile up. A real
// client sends its handshake as soon as it has connected.
constexpr std::chrono::seconds kHandshakeTimeout{5};
// At most this many connections may await their handshake; a new one beyond
// it closes the oldest, so a flood of idle connections cannot use up the
// process's file descriptors (which the job needs for checkpoints).
constexpr size_t kMaxPending = 64;
// The first refusals are logged one line each; after that one summary line
// per interval says how many more there were.
constexpr int kRefusalsLoggedInFull = 5;
constexpr std::chrono::seconds kRefusalSummaryEvery{10};

}  // namespace

class Server::Impl {
 public:
  Impl(const std::string& host, uint16_t port, std::string token, int listenFd);
  ~Impl();

  uint16_t port() const { return port_; }
  int64_t refused() const { return refused_.load(); }

 private:
  struct Connection {
    uint64_t id = 0;
    int fd = -1;
    std::string peer;
    bool authenticated = false;
    bool helloSeen = false;   // the server's proof went out; the client's is due
    std::string clientNonce;  // the handshake's nonces (auth.hpp)
    std::string serverNonce;
    bool closed = false;  // swept (fd closed, entry erased) at the end of a loop turn
    std::string in;       // received bytes not yet parsed into frames
    std::string out;      // reply bytes not yet accepted by the socket
    Clock::time_point handshakeDeadline;
    uint64_t pendingWaiter = 0;  // a GET/WAIT not yet answered; frames after it wait
  };
  struct Waiter {
    uint64_t connection;
    uint8_t command;
    std::string key;                // GET: the key whose value is the reply
    std::set<std::string> missing;  // keys that do not exist yet
  };

  void run();
  void acceptClients();
  void readFrom(Connection& c);
  void flush(Connection& c);
  void processFrames(uint64_t id);
  void handleHandshake(Connection& c, const std::string& payload);
  void handleRequest(uint64_t id, Connection& c, const std::string& payload);
  void keyStored(const std::string& key);
  void completeWaiter(uint64_t waiterId);
  // `handshake`: a client that may belong to this job was refused (no or
  // another token); kLastRefusalKey records it.
  void refuse(Connection& c, const std::string& reason, bool handshake = false);
  void drop(Connection& c);
  void send(Connection& c, const std::string& bytes);
  void loopTurn(std::vector<pollfd>& fds, std::vector<uint64_t>& ids, bool* stop);
  void evictOldestPending();
  void logRefusalSummary(bool force);

  uint16_t port_ = 0;
  std::string token_;
  int listener_ = -1;
  int wakeRead_ = -1;  // self-pipe: the destructor writes a byte to end poll()
  int wakeWrite_ = -1;
  std::atomic<int64_t> refused_{0};
  std::thread thread_;

  // Owned by the server thread alone.
  uint64_t nextConnection_ = 1;
  uint64_t nextWaiter_ = 1;
  std::map<uint64_t, Connection> connections_;
  std::deque<uint64_t> runnable_;  // connections whose buffered frames may now be processed
  std::unordered_map<std::string, Bytes> data_;
  std::map<uint64_t, Waiter> waiters_;
  std::unordered_map<std::string, std::vector<uint64_t>> waitersByKey_;
  std::set<uint64_t> pending_;  // connections awaiting their handshake, oldest first
  // Rate limit of the refusal log (refuse(), logRefusalSummary()).
  int refusalsLogged_ = 0;
  int64_t refusalsNotLogged_ = 0;
  std::string lastRefusal_;
  Clock::time_point nextRefusalSummary_{};
};

Server::Server(const std::string& host, uint16_t port, std::string token, int listenFd)
    : impl_(std::make_unique<Impl>(host, port, std::move(token), listenFd)) {}
Server::~Server() = default;
uint16_t Server::port() const { return impl_->port(); }
int64_t Server::refused() const { return impl_->refused(); }

Server::Impl::Impl(const std::string& host, uint16_t port, std::string token, int listenFd)
    : token_(std::move(token)) {
  const std::string where = formatHostPort(host, port);
  if (listenFd >= 0) {
    int listening = 0;
    socklen_t len = sizeof listening;
    if (::getsockopt(listenFd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) == 0 && listening != 0 &&
        (port == 0 || boundPort(listenFd) == port)) {
      ::fcntl(listenFd, F_SETFD, FD_CLOEXEC);
      ::fcntl(listenFd, F_SETFL, ::fcntl(listenFd, F_GETFL) | O_NONBLOCK);
      listener_ = listenFd;
      logInfo("TCPStore: serving on the socket the launcher bound (descriptor {})", listenFd);
    } else {
      // Not ours to close: it may be anything this process inherited.
      logWarn("TCPStore: descriptor {} is not a socket listening on port {}; binding {} instead", listenFd, port,
              where);
    }
  }
  AddrInfoList addrs;
  const std::string resolveError = resolve(host, port, /*passive=*/true, &addrs);
  if (!resolveError.empty()) {
    fail<StoreError>("TCPStore: cannot resolve the store address {}: {}. HINT: check MASTER_ADDR", where,
                     resolveError);
  }
  std::string lastError = "no usable address";
  for (addrinfo* a = listener_ >= 0 ? nullptr : addrs.list; a != nullptr && listener_ < 0; a = a->ai_next) {
    int err = 0;
    listener_ = listenOn(*a, &err);
    if (listener_ >= 0) break;
    if (err == EADDRINUSE) {
      fail<StoreError>(
          "TCPStore: cannot serve on {}: port {} is already in use ({}). HINT: another job or a leftover process "
          "holds it; set MASTER_PORT to another port (or 0 to pick a free one)",
          where, port, errnoText(err));
    }
    lastError = errnoText(err);
  }
  if (listener_ < 0) {
    fail<StoreError>("TCPStore: cannot serve on {}: {}. HINT: MASTER_ADDR must be an address of the rank-0 machine",
                     where, lastError);
  }
  port_ = boundPort(listener_);

  int pipeFds[2];
  if (::pipe2(pipeFds, O_NONBLOCK | O_CLOEXEC) != 0) {
    const int err = errno;
    ::close(listener_);
    fail<StoreError>("TCPStore: cannot create the server's wake-up pipe: {}", errnoText(err));
  }
  wakeRead_ = pipeFds[0];
  wakeWrite_ = pipeFds[1];
  thread_ = std::thread([this] { run(); });
  logInfo("TCPStore: server listening on {}", formatHostPort(host.empty() ? "*" : host, port_));
}

Server::Impl::~Impl() {
  const char byte = 1;
  while (::write(wakeWrite_, &byte, 1) < 0 && errno == EINTR) {
  }
  thread_.join();
  logRefusalSummary(true);
  for (auto& entry : connections_) closeFd(entry.second.fd);
  closeFd(listener_);
  closeFd(wakeRead_);
  closeFd(wakeWrite_);
}

void Server::Impl::run() {
  std::vector<pollfd> fds;
  std::vector<uint64_t> ids;  // ids[i] is the connection behind fds[i + 2]
  bool stop = false;
  int failuresLogged = 0;
  while (!stop) {
    // Nothing may escape this thread (an exception here would end the
    // process): a failure in one connection's work closes that connection
    // (see loopTurn); one outside any connection is logged and the loop goes on.
    try {
      loopTurn(fds, ids, &stop);
    } catch (const std::exception& e) {
      if (failuresLogged++ < kRefusalsLoggedInFull) logWarn("store server: {}; serving on", e.what());
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    } catch (...) {
      if (failuresLogged++ < kRefusalsLoggedInFull) logWarn("store server: unknown failure; serving on");
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
}

void Server::Impl::loopTurn(std::vector<pollfd>& fds, std::vector<uint64_t>& ids, bool* stop) {
  fds.assign({{wakeRead_, POLLIN, 0}, {listener_, POLLIN, 0}});
  ids.clear();
  auto nextDeadline = Clock::time_point::max();
  for (const auto& [id, c] : connections_) {
    // A connection holding a whole frame it may not process yet (behind a
    // pending GET/WAIT) is not read further: its buffer stays bounded.
    const size_t limit = 4 + static_cast<size_t>(c.authenticated ? kMaxFrame : kMaxHandshakeFrame);
    const short in = c.in.size() < limit ? POLLIN : 0;
    fds.push_back({c.fd, static_cast<short>(in | (c.out.empty() ? 0 : POLLOUT)), 0});
    ids.push_back(id);
    if (!c.authenticated) nextDeadline = std::min(nextDeadline, c.handshakeDeadline);
  }
  if (refusalsNotLogged_ > 0) nextDeadline = std::min(nextDeadline, nextRefusalSummary_);
  int timeoutMs = -1;
  if (nextDeadline != Clock::time_point::max()) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(nextDeadline - Clock::now());
    timeoutMs = static_cast<int>(std::max<int64_t>(0, left.count()));
  }
  const int rc = ::poll(fds.data(), fds.size(), timeoutMs);
  if (rc < 0) {
    if (errno == EINTR) return;
    logWarn("store server: poll failed: {}", errnoText(errno));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // do not spin on a persistent error
    return;
  }
  if (fds[0].revents != 0) {  // the destructor asked us to stop
    *stop = true;
    return;
  }
  if (fds[1].revents != 0) acceptClients();

  for (size_t i = 0; i < ids.size(); ++i) {
    const short revents = fds[i + 2].revents;
    auto it = connections_.find(ids[i]);
    if (revents == 0 || it == connections_.end() || it->second.closed) continue;
    try {
      if (revents & (POLLIN | POLLHUP | POLLERR)) {
        readFrom(it->second);
        runnable_.push_back(ids[i]);
      }
      if ((revents & POLLOUT) && !it->second.closed) flush(it->second);
    } catch (const std::exception& e) {
      // E.g. bad_alloc: lose this connection, keep serving the rest.
      refuse(it->second, fmt::format("the server failed on this connection: {}", e.what()));
    }
  }
  while (!runnable_.empty()) {
    const uint64_t id = runnable_.front();
    runnable_.pop_front();
    processFrames(id);
  }

  const auto now = Clock::now();
  for (auto it = connections_.begin(); it != connections_.end();) {
    Connection& c = it->second;
    if (!c.closed && !c.authenticated && now >= c.handshakeDeadline) {
      refuse(c, fmt::format("no handshake within {} s", kHandshakeTimeout.count()));
    }
    if (c.closed) {
      closeFd(c.fd);
      pending_.erase(it->first);
      it = connections_.erase(it);
    } else {
      ++it;
    }
  }
  logRefusalSummary(false);
}

void Server::Impl::acceptClients() {
  while (true) {
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    const int fd = ::accept4(listener_, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE) {
        logWarn("store server: cannot accept a connection: {}", errnoText(errno));
        // The pending connection keeps the listener readable; pause instead of spinning.
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      return;  // EAGAIN: nothing more to accept
    }
    setNoDelay(fd);
    if (pending_.size() >= kMaxPending) evictOldestPending();
    Connection c;
    c.id = nextConnection_++;
    c.fd = fd;
    c.peer = peerName(addr, len);
    c.handshakeDeadline = Clock::now() + kHandshakeTimeout;
    pending_.insert(c.id);
    connections_.emplace(c.id, std::move(c));
  }
}

void Server::Impl::evictOldestPending() {
  const uint64_t oldest = *pending_.begin();
  pending_.erase(pending_.begin());
  auto it = connections_.find(oldest);
  if (it == connections_.end()) return;
  refuse(it->second, fmt::format("more than {} connections await their handshake; closing the oldest", kMaxPending));
  // Closed now, not at the end of the loop turn: the descriptor is what we are short of.
  closeFd(it->second.fd);
  connections_.erase(it);
}

void Server::Impl::readFrom(Connection& c) {
  // One read per readiness event keeps the loop fair among connections.
  char buf[64 * 1024];
  ssize_t n;
  do {
    n = ::recv(c.fd, buf, sizeof buf, 0);
  } while (n < 0 && errno == EINTR);
  if (n > 0) {
    c.in.append(buf, static_cast<size_t>(n));
  } else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
    drop(c);  // the client left (or its connection broke)
  }
}

void Server::Impl::send(Connection& c, const std::string& bytes) {
  c.out += bytes;
  flush(c);
}

void Server::Impl::flush(Connection& c) {
  while (!c.out.empty()) {
    const ssize_t n = ::send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      c.out.erase(0, static_cast<size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return;  // the rest goes when poll reports POLLOUT
    } else {
      drop(c);
      return;
    }
  }
}

void Server::Impl::processFrames(uint64_t id) {
  auto it = connections_.find(id);
  if (it == connections_.end()) return;
  Connection& c = it->second;
  // Replies go out in request order: frames behind an unanswered GET/WAIT stay buffered.
  while (!c.closed && c.pendingWaiter == 0 && c.in.size() >= 4) {
    const uint32_t len = frameLength(c.in.data());
    // Checked before the body arrives, so a peer cannot make us buffer more
    // than the handshake needs before it has shown the token.
    const uint32_t limit = c.authenticated ? kMaxFrame : kMaxHandshakeFrame;
    if (len > limit) {
      refuse(c, fmt::format("{} of {} bytes exceeds the {}-byte limit (not a ddp store client?)",
                            c.authenticated ? "frame" : "handshake frame", len, limit));
      return;
    }
    if (c.in.size() < 4 + static_cast<size_t>(len)) return;
    try {
      const std::string payload = c.in.substr(4, len);
      c.in.erase(0, 4 + static_cast<size_t>(len));
      if (!c.authenticated) {
        handleHandshake(c, payload);
      } else {
        handleRequest(id, c, payload);
      }
    } catch (const std::exception& e) {
      // E.g. bad_alloc on a huge value: lose this connection, keep serving the rest.
      refuse(c, fmt::format("request failed on the server: {}", e.what()));
    }
  }
}

void Server::Impl::handleHandshake(Connection& c, const std::string& payload) {
  if (!c.helloSeen) {
    const std::string refusal = checkHello(payload, &c.clientNonce);
    if (!refusal.empty()) {
      refuse(c, refusal, /*handshake=*/true);
      return;
    }
    c.helloSeen = true;
    c.serverNonce = makeNonce();
    send(c, replyFrame(kOk, c.serverNonce + serverProof(token_, c.clientNonce, c.serverNonce)));
    return;
  }
  if (payload.empty()) {
    refuse(c, "wrong job token (the client found that this server does not know its token)", /*handshake=*/true);
    return;
  }
  if (!sameBytes(payload, clientProof(token_, c.clientNonce, c.serverNonce))) {
    refuse(c, "wrong job token", /*handshake=*/true);
    return;
  }
  c.authenticated = true;
  pending_.erase(c.id);
  send(c, replyFrame(kOk, ""));
}

void Server::Impl::handleRequest(uint64_t id, Connection& c, const std::string& payload) {
  Request request;
  if (!decodeRequest(payload, &request)) {
    refuse(c, "malformed request");
    return;
  }
  const std::vector<std::string>& keys = request.keys;
  switch (request.command) {
    case kSet:
      data_[keys[0]] = Bytes(request.value.begin(), request.value.end());
      send(c, replyFrame(kOk, ""));
      keyStored(keys[0]);
      break;
    case kAdd: {
      const int64_t delta = decodeDelta(request.value);
      auto found = data_.find(keys[0]);
      int64_t result;
      try {
        result = (found == data_.end() ? 0 : parseCounter(keys[0], found->second)) + delta;
      } catch (const StoreError& e) {
        send(c, replyFrame(kError, e.what()));
        break;
      }
      const Bytes text = formatCounter(result);
      data_[keys[0]] = text;
      send(c, replyFrame(kOk, std::string(text.begin(), text.end())));
      keyStored(keys[0]);
      break;
    }
    case kCheck: {
      bool all = true;
      for (const auto& k : keys) all = all && data_.count(k) != 0;
      send(c, replyFrame(kOk, std::string(1, all ? '\1' : '\0')));
      break;
    }
    case kGet:
    case kWait: {
      const uint8_t command = request.command;
      Waiter w{id, command, command == kGet ? keys[0] : std::string(), {}};
      for (const auto& k : keys) {
        if (data_.count(k) == 0) w.missing.insert(k);
      }
      if (w.missing.empty()) {
        send(c, replyFrame(kOk, command == kGet ? std::string(data_[keys[0]].begin(), data_[keys[0]].end()) : ""));
        break;
      }
      // Park the request: keyStored() answers it once its last key appears.
      const uint64_t waiterId = nextWaiter_++;
      for (const auto& k : w.missing) waitersByKey_[k].push_back(waiterId);
      waiters_.emplace(waiterId, std::move(w));
      c.pendingWaiter = waiterId;
      break;
    }
  }
}

void Server::Impl::keyStored(const std::string& key) {
  auto it = waitersByKey_.find(key);
  if (it == waitersByKey_.end()) return;
  const std::vector<uint64_t> ids = std::move(it->second);
  waitersByKey_.erase(it);
  for (uint64_t waiterId : ids) {
    auto w = waiters_.find(waiterId);
    if (w == waiters_.end()) continue;
    w->second.missing.erase(key);
    if (w->second.missing.empty()) completeWaiter(waiterId);
  }
}

void Server::Impl::completeWaiter(uint64_t waiterId) {
  auto w = waiters_.find(waiterId);
  const Waiter waiter = std::move(w->second);
  waiters_.erase(w);
  auto it = connections_.find(waiter.connection);
  if (it == connections_.end() || it->second.closed) return;
  Connection& c = it->second;
  c.pendingWaiter = 0;
  if (waiter.command == kGet) {
    const Bytes& value = data_[waiter.key];
    send(c, replyFrame(kOk, std::string(value.begin(), value.end())));
  } else {
    send(c, replyFrame(kOk, ""));
  }
  runnable_.push_back(waiter.connection);  // frames it sent meanwhile may now run
}

void Server::Impl::refuse(Connection& c, const std::string& reason, bool handshake) {
  refused_.fetch_add(1);
  if (handshake) {
    const std::string text = fmt::format("{}: {}", c.peer, reason);
    data_[kLastRefusalKey] = Bytes(text.begin(), text.end());
    keyStored(kLastRefusalKey);
  }
  // Rate-limited: a flood of rogue connections must not flood the log.
  if (refusalsLogged_ < kRefusalsLoggedInFull) {
    ++refusalsLogged_;
    logWarn("store server: refused connection from {}: {}{}", c.peer, reason,
            refusalsLogged_ == kRefusalsLoggedInFull
                ? fmt::format(" (further refusals are summed up every {} s)", kRefusalSummaryEvery.count())
                : "");
    nextRefusalSummary_ = Clock::now() + kRefusalSummaryEvery;
  } else {
    ++refusalsNotLogged_;
    lastRefusal_ = fmt::format("{}: {}", c.peer, reason);
  }
  // Best effort: the reply is tiny and the socket buffer empty, so a single
  // non-blocking send almost always takes it; we never wait for a rogue peer.
  c.out = replyFrame(kRefused, reason);
  flush(c);
  drop(c);
}

void Server::Impl::logRefusalSummary(bool force) {
  if (refusalsNotLogged_ == 0 || (!force && Clock::now() < nextRefusalSummary_)) return;
  logWarn("store server: refused {} more connection{} in the last {} s (the last from {})", refusalsNotLogged_,
          refusalsNotLogged_ == 1 ? "" : "s", kRefusalSummaryEvery.count(), lastRefusal_);
  refusalsNotLogged_ = 0;
  nextRefusalSummary_ = Clock::now() + kRefusalSummaryEvery;
}

void Server::Impl::drop(Connection& c) {
  if (c.closed) return;
  c.closed = true;
  pending_.erase(c.id);
  c.in.clear();
  c.out.clear();
  if (c.pendingWaiter != 0) {
    auto w = waiters_.find(c.pendingWaiter);
    if (w != waiters_.end()) {
      for (const auto& k : w->second.missing) {
        auto byKey = waitersByKey_.find(k);
        if (byKey == waitersByKey_.end()) continue;
        auto& ids = byKey->second;
        ids.erase(std::remove(ids.begin(), ids.end(), c.pendingWaiter), ids.end());
        if (ids.empty()) waitersByKey_.erase(byKey);
      }
      waiters_.erase(w);
    }
    c.pendingWaiter = 0;
  }
}

}  // namespace ddp::tcpstore
