// TCPStore: rank 0 serves the key-value map from one event-loop thread; every
// rank, rank 0 included, talks to it as a client over TCP.
//
// Wire protocol. Everything travels in frames: a 4-byte big-endian payload
// length, then the payload. Frames over kMaxFrame are refused.
// - Handshake (client -> server, the first frame of a connection):
//     "DDPSTORE" (8 bytes) | version (1 byte) | token (the rest)
// - Request (client -> server, one at a time per connection):
//     command (1 byte) | key count (u32) | per key: length (u32), bytes |
//     value length (u32) | value bytes
//   SET: 1 key, the value.  GET: 1 key.  ADD: 1 key, an 8-byte big-endian
//   int64 delta.  CHECK, WAIT: any number of keys, no value.
// - Reply (server -> client): status (1 byte) | body
//   kOk: the handshake was accepted, or the result (GET: the value; ADD: the
//   new counter as decimal text; CHECK: one byte 0/1; SET, WAIT: empty).
//   kError: a message; the connection stays usable (e.g. ADD on a non-counter).
//   kRefused: the reason; the server closes the connection after it.
// GET and WAIT on absent keys are answered only once the keys exist, so a
// waiting client costs the server nothing but a table entry. Timeouts are the
// client's business: a client that gives up closes its connection, which
// drops its pending waiter on the server.
#include "framework/store/tcp_store.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <set>
#include <thread>
#include <unordered_map>

#include "framework/core/help_links.hpp"
#include "framework/store/store_util.hpp"

namespace ddp {

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kMaxFrame = 1u << 30;  // 1 GiB: far above any real value, far below garbage lengths
constexpr char kMagic[8] = {'D', 'D', 'P', 'S', 'T', 'O', 'R', 'E'};
constexpr uint8_t kProtocolVersion = 1;
// A peer that connects but sends no handshake is dropped after this long, so
// port scanners and stuck half-open connections do not pile up.
constexpr std::chrono::seconds kHandshakeTimeout{10};

enum Command : uint8_t { kSet = 1, kGet = 2, kAdd = 3, kCheck = 4, kWait = 5 };
enum Status : uint8_t { kOk = 0, kError = 1, kRefused = 2 };

const char* commandName(uint8_t command) {
  switch (command) {
    case kSet: return "set";
    case kGet: return "get";
    case kAdd: return "add";
    case kCheck: return "check";
    case kWait: return "wait";
  }
  return "?";
}

std::string errnoText(int err) { return std::strerror(err); }

std::string formatHostPort(const std::string& host, uint16_t port) {
  // IPv6 literals need brackets, or the port reads as one more group.
  const bool ipv6 = host.find(':') != std::string::npos;
  return (ipv6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

// ---- byte encoding ---------------------------------------------------------

void putU32(std::string& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>((v >> shift) & 0xff));
}

void putU64(std::string& out, uint64_t v) {
  for (int shift = 56; shift >= 0; shift -= 8) out.push_back(static_cast<char>((v >> shift) & 0xff));
}

uint64_t getBigEndian(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

// Reads fields from a payload; every read checks the bounds, since the bytes
// may come from anyone who can reach the port.
class Reader {
 public:
  explicit Reader(const std::string& data) : data_(data) {}

  bool u8(uint8_t* v) {
    if (left() < 1) return false;
    *v = static_cast<uint8_t>(data_[pos_++]);
    return true;
  }
  bool u32(uint32_t* v) {
    if (left() < 4) return false;
    *v = static_cast<uint32_t>(getBigEndian(data_.data() + pos_, 4));
    pos_ += 4;
    return true;
  }
  bool bytes(size_t n, std::string* out) {
    if (left() < n) return false;
    out->assign(data_, pos_, n);
    pos_ += n;
    return true;
  }
  size_t left() const { return data_.size() - pos_; }

 private:
  const std::string& data_;
  size_t pos_ = 0;
};

std::string frame(const std::string& payload) {
  std::string out;
  out.reserve(4 + payload.size());
  putU32(out, static_cast<uint32_t>(payload.size()));
  out += payload;
  return out;
}

std::string reply(Status status, const std::string& body) {
  std::string payload(1, static_cast<char>(status));
  payload += body;
  return frame(payload);
}

// Tokens are compared in time independent of where they differ, so that a
// peer cannot learn the token a byte at a time from reply latency.
bool tokensEqual(const std::string& a, const std::string& b) {
  unsigned diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned x = i < a.size() ? static_cast<uint8_t>(a[i]) : 0;
    const unsigned y = i < b.size() ? static_cast<uint8_t>(b[i]) : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

std::string peerName(const sockaddr_storage& addr, socklen_t len) {
  char host[NI_MAXHOST];
  char serv[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, host, sizeof host, serv, sizeof serv,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "(unknown peer)";
  }
  return formatHostPort(host, static_cast<uint16_t>(std::atoi(serv)));
}

void setNoDelay(int fd) {
  int one = 1;
  // Requests are small and latency-bound; Nagle would hold them back.
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

struct AddrInfoList {
  addrinfo* list = nullptr;
  ~AddrInfoList() {
    if (list) freeaddrinfo(list);
  }
};

// Resolves host:port; "" means the wildcard address for a server and the
// loopback address for a client. Returns "" or getaddrinfo's error text.
std::string resolve(const std::string& host, uint16_t port, bool passive, AddrInfoList* out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;  // IPv4 and IPv6 alike
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  const std::string service = std::to_string(port);
  const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &out->list);
  if (rc == 0) return "";
  return rc == EAI_SYSTEM ? errnoText(errno) : gai_strerror(rc);
}

// ---- client-side blocking I/O with a deadline --------------------------------

struct IoTimeout {};
struct ConnectionLost {
  std::string reason;
};

// Waits until fd is ready for `events`; false once the deadline passes.
bool waitReady(int fd, short events, Clock::time_point deadline) {
  while (true) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1 << 30)));
    if (rc > 0) return true;  // ready, or an error the next send/recv reports
    if (rc < 0 && errno != EINTR) throw ConnectionLost{"poll: " + errnoText(errno)};
  }
}

void sendAll(int fd, const std::string& data, Clock::time_point deadline) {
  size_t done = 0;
  while (done < data.size()) {
    // MSG_NOSIGNAL: a dead server must surface as an error, not kill us with SIGPIPE.
    const ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!waitReady(fd, POLLOUT, deadline)) throw IoTimeout{};
    } else {
      throw ConnectionLost{n < 0 ? errnoText(errno) : "send returned 0"};
    }
  }
}

void recvAll(int fd, char* buf, size_t len, Clock::time_point deadline) {
  size_t done = 0;
  while (done < len) {
    const ssize_t n = ::recv(fd, buf + done, len - done, 0);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n == 0) {
      throw ConnectionLost{"the server closed the connection"};
    } else if (errno == EINTR) {
      continue;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!waitReady(fd, POLLIN, deadline)) throw IoTimeout{};
    } else {
      throw ConnectionLost{errnoText(errno)};
    }
  }
}

// Reads one reply frame; returns its status and puts its body in *body.
Status recvReply(int fd, std::string* body, Clock::time_point deadline) {
  char header[4];
  recvAll(fd, header, 4, deadline);
  const uint64_t len = getBigEndian(header, 4);
  if (len < 1 || len > kMaxFrame) throw ConnectionLost{"malformed reply from the server"};
  std::string payload(len, '\0');
  recvAll(fd, &payload[0], len, deadline);
  const auto status = static_cast<Status>(static_cast<uint8_t>(payload[0]));
  body->assign(payload, 1, std::string::npos);
  return status;
}

void closeFd(int fd) {
  if (fd >= 0) ::close(fd);
}

}  // namespace

// ============================================================================
// Server
// ============================================================================

class TCPStoreServer {
 public:
  TCPStoreServer(const std::string& host, uint16_t port, std::string token);
  ~TCPStoreServer();

  uint16_t port() const { return port_; }
  int64_t refused() const { return refused_.load(); }

 private:
  struct Connection {
    int fd = -1;
    std::string peer;
    bool authenticated = false;
    bool closed = false;  // swept (fd closed, entry erased) at the end of a loop turn
    std::string in;       // received bytes not yet parsed into frames
    std::string out;      // reply bytes not yet accepted by the socket
    Clock::time_point handshakeDeadline;
    uint64_t pendingWaiter = 0;  // a GET/WAIT not yet answered; frames after it wait
  };
  struct Waiter {
    uint64_t connection;
    uint8_t command;
    std::string key;              // GET: the key whose value is the reply
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
  void refuse(Connection& c, const std::string& reason);
  void drop(Connection& c);
  void send(Connection& c, const std::string& bytes);

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
};

TCPStoreServer::TCPStoreServer(const std::string& host, uint16_t port, std::string token)
    : token_(std::move(token)) {
  const std::string where = formatHostPort(host, port);
  AddrInfoList addrs;
  const std::string resolveError = resolve(host, port, /*passive=*/true, &addrs);
  if (!resolveError.empty()) {
    throw StoreError("TCPStore: cannot resolve the store address " + where + ": " + resolveError +
                     ". HINT: check MASTER_ADDR");
  }
  std::string lastError = "no usable address";
  for (addrinfo* a = addrs.list; a != nullptr && listener_ < 0; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      lastError = errnoText(errno);
      continue;
    }
    int one = 1;
    // Lets a restarted job rebind the port while old connections sit in TIME_WAIT.
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0) {
      const int err = errno;
      ::close(fd);
      if (err == EADDRINUSE) {
        throw StoreError("TCPStore: cannot serve on " + where + ": port " + std::to_string(port) +
                         " is already in use (" + errnoText(err) +
                         "). HINT: another job or a leftover process holds it; set MASTER_PORT to another "
                         "port (or 0 to pick a free one)");
      }
      lastError = errnoText(err);
      continue;
    }
    if (::listen(fd, SOMAXCONN) != 0) {
      lastError = errnoText(errno);
      ::close(fd);
      continue;
    }
    listener_ = fd;
  }
  if (listener_ < 0) {
    throw StoreError("TCPStore: cannot serve on " + where + ": " + lastError +
                     ". HINT: MASTER_ADDR must be an address of the rank-0 machine");
  }
  sockaddr_storage bound{};
  socklen_t boundLen = sizeof bound;
  getsockname(listener_, reinterpret_cast<sockaddr*>(&bound), &boundLen);
  port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);

  int pipeFds[2];
  if (::pipe2(pipeFds, O_NONBLOCK | O_CLOEXEC) != 0) {
    const int err = errno;
    ::close(listener_);
    throw StoreError("TCPStore: cannot create the server's wake-up pipe: " + errnoText(err));
  }
  wakeRead_ = pipeFds[0];
  wakeWrite_ = pipeFds[1];
  thread_ = std::thread([this] { run(); });
}

TCPStoreServer::~TCPStoreServer() {
  const char byte = 1;
  while (::write(wakeWrite_, &byte, 1) < 0 && errno == EINTR) {
  }
  thread_.join();
  for (auto& entry : connections_) closeFd(entry.second.fd);
  closeFd(listener_);
  closeFd(wakeRead_);
  closeFd(wakeWrite_);
}

void TCPStoreServer::run() {
  std::vector<pollfd> fds;
  std::vector<uint64_t> ids;  // ids[i] is the connection behind fds[i + 2]
  while (true) {
    fds.assign({{wakeRead_, POLLIN, 0}, {listener_, POLLIN, 0}});
    ids.clear();
    auto nextDeadline = Clock::time_point::max();
    for (const auto& [id, c] : connections_) {
      fds.push_back({c.fd, static_cast<short>(POLLIN | (c.out.empty() ? 0 : POLLOUT)), 0});
      ids.push_back(id);
      if (!c.authenticated) nextDeadline = std::min(nextDeadline, c.handshakeDeadline);
    }
    int timeoutMs = -1;
    if (nextDeadline != Clock::time_point::max()) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(nextDeadline - Clock::now());
      timeoutMs = static_cast<int>(std::max<int64_t>(0, left.count()));
    }
    const int rc = ::poll(fds.data(), fds.size(), timeoutMs);
    if (rc < 0) {
      if (errno == EINTR) continue;
      std::fprintf(stderr, "ddp store: server poll failed: %s\n", std::strerror(errno));
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // do not spin on a persistent error
      continue;
    }
    if (fds[0].revents != 0) return;  // the destructor asked us to stop
    if (fds[1].revents != 0) acceptClients();

    for (size_t i = 0; i < ids.size(); ++i) {
      const short revents = fds[i + 2].revents;
      auto it = connections_.find(ids[i]);
      if (revents == 0 || it == connections_.end() || it->second.closed) continue;
      if (revents & (POLLIN | POLLHUP | POLLERR)) {
        readFrom(it->second);
        runnable_.push_back(ids[i]);
      }
      if ((revents & POLLOUT) && !it->second.closed) flush(it->second);
    }
    while (!runnable_.empty()) {
      const uint64_t id = runnable_.front();
      runnable_.pop_front();
      processFrames(id);
    }

    const auto now = Clock::now();
    for (auto it = connections_.begin(); it != connections_.end();) {
      Connection& c = it->second;
      if (!c.closed && !c.authenticated && now >= c.handshakeDeadline) refuse(c, "no handshake within 10 s");
      if (c.closed) {
        closeFd(c.fd);
        it = connections_.erase(it);
      } else {
        ++it;
      }
    }
  }
}

void TCPStoreServer::acceptClients() {
  while (true) {
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    const int fd = ::accept4(listener_, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE) {
        std::fprintf(stderr, "ddp store: cannot accept a connection: %s\n", std::strerror(errno));
        // The pending connection keeps the listener readable; pause instead of spinning.
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      return;  // EAGAIN: nothing more to accept
    }
    setNoDelay(fd);
    Connection c;
    c.fd = fd;
    c.peer = peerName(addr, len);
    c.handshakeDeadline = Clock::now() + kHandshakeTimeout;
    connections_.emplace(nextConnection_++, std::move(c));
  }
}

void TCPStoreServer::readFrom(Connection& c) {
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

void TCPStoreServer::send(Connection& c, const std::string& bytes) {
  c.out += bytes;
  flush(c);
}

void TCPStoreServer::flush(Connection& c) {
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

void TCPStoreServer::processFrames(uint64_t id) {
  auto it = connections_.find(id);
  if (it == connections_.end()) return;
  Connection& c = it->second;
  // Replies go out in request order: frames behind an unanswered GET/WAIT stay buffered.
  while (!c.closed && c.pendingWaiter == 0 && c.in.size() >= 4) {
    const uint64_t len = getBigEndian(c.in.data(), 4);
    if (len > kMaxFrame) {
      // Checked before the body arrives, so garbage cannot make us buffer a gigabyte.
      refuse(c, "frame of " + std::to_string(len) + " bytes exceeds the " + std::to_string(kMaxFrame) +
                    "-byte limit (not a ddp store client?)");
      return;
    }
    if (c.in.size() < 4 + len) return;
    const std::string payload = c.in.substr(4, len);
    c.in.erase(0, 4 + len);
    try {
      if (!c.authenticated) {
        handleHandshake(c, payload);
      } else {
        handleRequest(id, c, payload);
      }
    } catch (const std::exception& e) {
      // E.g. bad_alloc on a huge value: lose this connection, keep serving the rest.
      refuse(c, std::string("request failed on the server: ") + e.what());
    }
  }
}

void TCPStoreServer::handleHandshake(Connection& c, const std::string& payload) {
  Reader r(payload);
  std::string magic;
  uint8_t version = 0;
  if (!r.bytes(sizeof kMagic, &magic) || magic != std::string(kMagic, sizeof kMagic) || !r.u8(&version)) {
    refuse(c, "malformed handshake (not a ddp store client?)");
    return;
  }
  if (version != kProtocolVersion) {
    refuse(c, "store protocol version " + std::to_string(version) + ", expected " +
                  std::to_string(kProtocolVersion));
    return;
  }
  std::string token;
  r.bytes(r.left(), &token);
  if (!tokensEqual(token, token_)) {
    refuse(c, "wrong job token");
    return;
  }
  c.authenticated = true;
  send(c, reply(kOk, ""));
}

void TCPStoreServer::handleRequest(uint64_t id, Connection& c, const std::string& payload) {
  Reader r(payload);
  uint8_t command = 0;
  uint32_t keyCount = 0;
  std::vector<std::string> keys;
  bool ok = r.u8(&command) && r.u32(&keyCount) && keyCount <= r.left() / 4;
  for (uint32_t i = 0; ok && i < keyCount; ++i) {
    uint32_t len = 0;
    keys.emplace_back();
    ok = r.u32(&len) && r.bytes(len, &keys.back());
  }
  uint32_t valueLen = 0;
  std::string value;
  ok = ok && r.u32(&valueLen) && r.bytes(valueLen, &value) && r.left() == 0;
  const bool oneKey = keys.size() == 1;
  switch (command) {
    case kSet: ok = ok && oneKey; break;
    case kGet: ok = ok && oneKey && value.empty(); break;
    case kAdd: ok = ok && oneKey && value.size() == 8; break;
    case kCheck:
    case kWait: ok = ok && value.empty(); break;
    default: ok = false;
  }
  if (!ok) {
    refuse(c, "malformed request");
    return;
  }

  switch (command) {
    case kSet:
      data_[keys[0]] = Bytes(value.begin(), value.end());
      send(c, reply(kOk, ""));
      keyStored(keys[0]);
      break;
    case kAdd: {
      const auto delta = static_cast<int64_t>(getBigEndian(value.data(), 8));
      auto found = data_.find(keys[0]);
      int64_t result;
      try {
        result = (found == data_.end() ? 0 : parseCounter(keys[0], found->second)) + delta;
      } catch (const StoreError& e) {
        send(c, reply(kError, e.what()));
        break;
      }
      const Bytes text = formatCounter(result);
      data_[keys[0]] = text;
      send(c, reply(kOk, std::string(text.begin(), text.end())));
      keyStored(keys[0]);
      break;
    }
    case kCheck: {
      bool all = true;
      for (const auto& k : keys) all = all && data_.count(k) != 0;
      send(c, reply(kOk, std::string(1, all ? '\1' : '\0')));
      break;
    }
    case kGet:
    case kWait: {
      Waiter w{id, command, command == kGet ? keys[0] : std::string(), {}};
      for (const auto& k : keys) {
        if (data_.count(k) == 0) w.missing.insert(k);
      }
      if (w.missing.empty()) {
        send(c, reply(kOk, command == kGet ? std::string(data_[keys[0]].begin(), data_[keys[0]].end()) : ""));
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

void TCPStoreServer::keyStored(const std::string& key) {
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

void TCPStoreServer::completeWaiter(uint64_t waiterId) {
  auto w = waiters_.find(waiterId);
  const Waiter waiter = std::move(w->second);
  waiters_.erase(w);
  auto it = connections_.find(waiter.connection);
  if (it == connections_.end() || it->second.closed) return;
  Connection& c = it->second;
  c.pendingWaiter = 0;
  if (waiter.command == kGet) {
    const Bytes& value = data_[waiter.key];
    send(c, reply(kOk, std::string(value.begin(), value.end())));
  } else {
    send(c, reply(kOk, ""));
  }
  runnable_.push_back(waiter.connection);  // frames it sent meanwhile may now run
}

void TCPStoreServer::refuse(Connection& c, const std::string& reason) {
  refused_.fetch_add(1);
  std::fprintf(stderr, "ddp store: refused connection from %s: %s\n", c.peer.c_str(), reason.c_str());
  // Best effort: the reply is tiny and the socket buffer empty, so a single
  // non-blocking send almost always takes it; we never wait for a rogue peer.
  c.out = reply(kRefused, reason);
  flush(c);
  drop(c);
}

void TCPStoreServer::drop(Connection& c) {
  if (c.closed) return;
  c.closed = true;
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

// ============================================================================
// Client
// ============================================================================

TCPStore::TCPStore(TCPStoreOptions options) : options_(std::move(options)) {
  timeout_ = options_.timeout;
  if (!options_.token.empty()) {
    token_ = options_.token;
  } else if (options_.tokenFromEnvironment) {
    const char* env = std::getenv(kStoreTokenEnv);
    token_ = env ? env : "";
  }
  port_ = options_.port;
  if (options_.isServer) {
    server_ = std::make_unique<TCPStoreServer>(options_.host, options_.port, token_);
    port_ = server_->port();
  }
  // Connect now, so that a wrong address or token fails at construction, not
  // at the first request deep inside rendezvous.
  idleSockets_.push_back(connect(options_.connectTimeout));
}

TCPStore::~TCPStore() {
  for (int fd : idleSockets_) closeFd(fd);
  server_.reset();  // after our own sockets: the server needs no goodbye from us
}

std::string TCPStore::hostPort() const { return formatHostPort(options_.host, port_); }

std::string TCPStore::describe() const { return "tcp://" + hostPort(); }

int64_t TCPStore::refusedConnections() const { return server_ ? server_->refused() : 0; }

int TCPStore::connect(std::chrono::milliseconds connectTimeout) {
  const auto deadline = Clock::now() + connectTimeout;
  auto backoff = std::chrono::milliseconds(10);
  std::string lastError = "no attempt finished";
  while (true) {
    AddrInfoList addrs;
    const std::string resolveError = resolve(options_.host, port_, /*passive=*/false, &addrs);
    if (!resolveError.empty()) lastError = "cannot resolve host: " + resolveError;
    for (addrinfo* a = addrs.list; a != nullptr; a = a->ai_next) {
      const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) {
        lastError = errnoText(errno);
        continue;
      }
      // Non-blocking connect, so that an unreachable host cannot outlast the deadline.
      int err = 0;
      if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
        err = errno;
        if (err == EINPROGRESS || err == EINTR) {
          // A little grace past the deadline lets the last attempt report the
          // real error (say, "Connection refused") rather than our own timeout.
          const auto attemptDeadline = std::max(deadline, Clock::now() + std::chrono::milliseconds(100));
          try {
            err = waitReady(fd, POLLOUT, attemptDeadline) ? 0 : ETIMEDOUT;
          } catch (const ConnectionLost&) {
            err = EIO;
          }
          socklen_t len = sizeof err;
          if (err == 0 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
        }
      }
      if (err != 0) {
        lastError = errnoText(err);
        ::close(fd);
        continue;
      }
      setNoDelay(fd);

      std::string hello(kMagic, sizeof kMagic);
      hello.push_back(static_cast<char>(kProtocolVersion));
      hello += token_;
      std::string body;
      Status status;
      try {
        // The handshake gets its own allowance: connecting may have used up the deadline.
        const auto handshakeDeadline = std::max(deadline, Clock::now() + std::chrono::seconds(5));
        sendAll(fd, frame(hello), handshakeDeadline);
        status = recvReply(fd, &body, handshakeDeadline);
      } catch (const IoTimeout&) {
        lastError = "no reply to the handshake";
        ::close(fd);
        continue;
      } catch (const ConnectionLost& e) {
        lastError = "handshake failed: " + e.reason;
        ::close(fd);
        continue;
      }
      if (status == kOk) return fd;
      ::close(fd);
      // A refusal is final: retrying with the same token cannot succeed.
      const std::string hint = body.find("token") != std::string::npos
                                   ? std::string("HINT: all ranks must share ") + kStoreTokenEnv +
                                         " (ddp-run sets it for the ranks it spawns)"
                                   : "HINT: is " + hostPort() + " a ddp store of the same version?";
      throw StoreError("TCPStore: connection refused by the store server at " + hostPort() + ": " + body + ". " +
                       hint);
    }
    const auto now = Clock::now();
    if (now >= deadline) break;
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(250));
  }
  throw StoreError("TCPStore: cannot connect to the store server at " + hostPort() + " within " +
                   std::to_string(connectTimeout.count()) + " ms: " + lastError +
                   ". HINT: check MASTER_ADDR/MASTER_PORT and that rank 0 is running (it serves the store); " +
                   kRendezvousHelp);
}

int TCPStore::borrowConnection() {
  {
    std::lock_guard<std::mutex> lock(poolMutex_);
    if (!lostReason_.empty()) {
      throw StoreError("store " + describe() + ": the store server has gone away (" + lostReason_ +
                       "). HINT: rank 0 serves the store; check whether it exited or crashed");
    }
    if (!idleSockets_.empty()) {
      const int fd = idleSockets_.back();
      idleSockets_.pop_back();
      return fd;
    }
  }
  return connect(options_.connectTimeout);  // every idle connection is busy in another thread
}

void TCPStore::returnConnection(int fd) {
  std::lock_guard<std::mutex> lock(poolMutex_);
  idleSockets_.push_back(fd);
}

Bytes TCPStore::request(uint8_t command, const std::vector<std::string>& keys, const Bytes& value,
                        std::chrono::milliseconds timeout) {
  std::string payload(1, static_cast<char>(command));
  putU32(payload, static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) {
    putU32(payload, static_cast<uint32_t>(k.size()));
    payload += k;
  }
  putU32(payload, static_cast<uint32_t>(value.size()));
  payload.append(value.begin(), value.end());
  if (payload.size() > kMaxFrame) {
    throw StoreError("store " + describe() + ": " + commandName(command) + " of " + std::to_string(payload.size()) +
                     " bytes exceeds the " + std::to_string(kMaxFrame) + "-byte limit of a request");
  }

  const auto deadline = Clock::now() + timeout;
  const int fd = borrowConnection();
  std::string body;
  Status status;
  try {
    sendAll(fd, frame(payload), deadline);
    status = recvReply(fd, &body, deadline);
  } catch (const IoTimeout&) {
    // The reply may still come later; closing the connection (rather than
    // reusing it) keeps replies in step, and tells the server to drop our waiter.
    ::close(fd);
    if (command == kGet || command == kWait) throw StoreTimeout(waitTimeoutMessage(describe(), keys, timeout));
    throw StoreTimeout("store " + describe() + ": no reply to " + commandName(command) + " of key '" +
                       (keys.empty() ? "" : keys[0]) + "' within " + std::to_string(timeout.count()) + " ms. HINT: " +
                       kRendezvousHelp);
  } catch (const ConnectionLost& e) {
    ::close(fd);
    {
      std::lock_guard<std::mutex> lock(poolMutex_);
      if (lostReason_.empty()) lostReason_ = e.reason;
    }
    throw StoreError("store " + describe() + ": lost the connection to the store server during " +
                     commandName(command) + " (" + e.reason +
                     "). HINT: rank 0 serves the store; check whether it exited or crashed");
  }
  if (status == kRefused) {
    ::close(fd);  // the server closes a connection it refuses
    throw StoreError("store " + describe() + ": the server refused " + commandName(command) + ": " + body);
  }
  returnConnection(fd);
  if (status != kOk) throw StoreError(body);
  return Bytes(body.begin(), body.end());
}

void TCPStore::set(const std::string& key, const Bytes& value) { request(kSet, {key}, value, timeout_); }

Bytes TCPStore::get(const std::string& key) { return request(kGet, {key}, {}, timeout_); }

int64_t TCPStore::add(const std::string& key, int64_t delta) {
  std::string encoded;
  putU64(encoded, static_cast<uint64_t>(delta));
  return parseCounter(key, request(kAdd, {key}, Bytes(encoded.begin(), encoded.end()), timeout_));
}

bool TCPStore::check(const std::vector<std::string>& keys) {
  const Bytes reply = request(kCheck, keys, {}, timeout_);
  return reply.size() == 1 && reply[0] == 1;
}

void TCPStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  request(kWait, keys, {}, effectiveTimeout(timeout));
}

}  // namespace ddp
