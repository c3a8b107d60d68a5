#include "framework/store/tcp/client.hpp"

#include <unistd.h>

#include <algorithm>
#include <thread>

#include "framework/core/errors.hpp"
#include "framework/core/help_links.hpp"
#include "framework/core/log.hpp"
#include "framework/store/store_util.hpp"
#include "framework/store/tcp/auth.hpp"
#include "framework/store/tcp/socket.hpp"
#include "framework/store/tcp/wire.hpp"
#include "framework/store/tcp_store.hpp"  // kStoreTokenEnv

namespace ddp::tcpstore {

namespace {

constexpr std::chrono::seconds kConnectProgressEvery{10};

// Reads one reply frame; returns its status and puts its body in *body.
// `limit` bounds what a server may make us allocate (a small one before it
// has proven the token).
Status recvReply(int fd, std::string* body, Clock::time_point deadline, uint32_t limit = kMaxFrame) {
  char header[4];
  recvAll(fd, header, 4, deadline);
  const uint32_t len = frameLength(header);
  if (len < 1 || len > limit) throw ConnectionLost{"malformed reply from the server"};
  std::string payload(len, '\0');
  recvAll(fd, &payload[0], len, deadline);
  Status status = kError;
  decodeReply(payload, &status, body);
  return status;
}

}  // namespace

Client::Client(std::string host, uint16_t port, std::string token, std::chrono::milliseconds connectTimeout)
    : host_(std::move(host)), port_(port), token_(std::move(token)), connectTimeout_(connectTimeout) {
  const auto start = Clock::now();
  const Connected first = connect();
  idle_.push_back(first.fd);
  logInfo("TCPStore: connected to {} after {} ms ({} attempt{})", hostPort(),
          std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count(), first.attempts,
          first.attempts == 1 ? "" : "s");
}

Client::~Client() {
  for (int fd : idle_) closeFd(fd);
}

std::string Client::hostPort() const { return formatHostPort(host_, port_); }

std::string Client::describe() const { return fmt::format("tcp://{}", hostPort()); }

Client::Connected Client::connect() {
  const auto deadline = Clock::now() + connectTimeout_;
  auto backoff = std::chrono::milliseconds(10);
  std::string lastError = "no attempt finished";
  int attempts = 0;
  // A node started long before rank 0's says so now and then, not only at the end.
  const auto start = Clock::now();
  auto nextProgress = start + kConnectProgressEvery;
  while (true) {
    ++attempts;
    AddrInfoList addrs;
    const std::string resolveError = resolve(host_, port_, /*passive=*/false, &addrs);
    if (!resolveError.empty()) lastError = fmt::format("cannot resolve host: {}", resolveError);
    for (addrinfo* a = addrs.list; a != nullptr; a = a->ai_next) {
      // A little grace past the deadline lets the last attempt report the
      // real error (say, "Connection refused") rather than our own timeout.
      const int fd = connectTo(*a, std::max(deadline, Clock::now() + std::chrono::milliseconds(100)), &lastError);
      if (fd < 0) continue;

      std::string body;
      Status status;
      bool serverKnowsToken = true;
      try {
        // The handshake gets its own allowance: connecting may have used up the deadline.
        const auto handshakeDeadline = std::max(deadline, Clock::now() + std::chrono::seconds(5));
        const std::string clientNonce = makeNonce();
        sendAll(fd, helloFrame(clientNonce), handshakeDeadline);
        status = recvReply(fd, &body, handshakeDeadline, kMaxHandshakeFrame);
        if (status == kOk) {
          if (body.size() != kNonceBytes + kProofBytes) throw ConnectionLost{"malformed handshake reply"};
          const std::string serverNonce = body.substr(0, kNonceBytes);
          // The server proves first: one that does not know the token learns nothing from us.
          serverKnowsToken = sameBytes(body.substr(kNonceBytes), serverProof(token_, clientNonce, serverNonce));
          sendAll(fd, frame(serverKnowsToken ? clientProof(token_, clientNonce, serverNonce) : std::string()),
                  handshakeDeadline);
          if (serverKnowsToken) status = recvReply(fd, &body, handshakeDeadline, kMaxHandshakeFrame);
        }
      } catch (const IoTimeout&) {
        lastError = "no reply to the handshake";
        ::close(fd);
        continue;
      } catch (const ConnectionLost& e) {
        lastError = fmt::format("handshake failed: {}", e.reason);
        ::close(fd);
        continue;
      }
      if (!serverKnowsToken && token_.empty()) {
        ::close(fd);
        // This node has no token and the store asks for one.
        fail<StoreError>(
            "TCPStore: this process has no {} and the store server at {} requires one. HINT: export {} (or {}_FILE) "
            "on this node with the job's token, as on the node that serves the store",
            kStoreTokenEnv, hostPort(), kStoreTokenEnv, kStoreTokenEnv);
      }
      if (!serverKnowsToken) {
        ::close(fd);
        // Final: another job's store, or a process that took the port.
        fail<StoreError>(
            "TCPStore: the store server at {} does not know this job's token: it is another job's store, a process "
            "that took the port, or rank 0 runs with another {}. HINT: all ranks must share {} (ddp-run sets it for "
            "the ranks it spawns); check MASTER_ADDR/MASTER_PORT",
            hostPort(), kStoreTokenEnv, kStoreTokenEnv);
      }
      if (status == kOk) return {fd, attempts};
      ::close(fd);
      // A refusal is final: retrying with the same token cannot succeed.
      if (body.find("token") != std::string::npos) {
        fail<StoreError>(
            "TCPStore: connection refused by the store server at {}: {}. HINT: all ranks must share {} (ddp-run "
            "sets it for the ranks it spawns)",
            hostPort(), body, kStoreTokenEnv);
      }
      fail<StoreError>(
          "TCPStore: connection refused by the store server at {}: {}. HINT: is {} a ddp store of the same version?",
          hostPort(), body, hostPort());
    }
    const auto now = Clock::now();
    if (now >= deadline) break;
    if (now >= nextProgress) {
      logWarn("TCPStore: still waiting for the store server at {} after {} s ({}); rank 0 serves it", hostPort(),
              std::chrono::duration_cast<std::chrono::seconds>(now - start).count(), lastError);
      nextProgress += kConnectProgressEvery;
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(250));
  }
  fail<StoreError>(
      "TCPStore: cannot connect to the store server at {} within {} ms: {}. HINT: check MASTER_ADDR/MASTER_PORT and "
      "that rank 0 is running (it serves the store); {}",
      hostPort(), connectTimeout_.count(), lastError, kRendezvousHelp);
}

int Client::borrow() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!lostReason_.empty()) {
      fail<StoreError>(
          "store {}: the store server has gone away ({}). HINT: rank 0 serves the store; check whether it exited or "
          "crashed",
          describe(), lostReason_);
    }
    if (!idle_.empty()) {
      const int fd = idle_.back();
      idle_.pop_back();
      return fd;
    }
  }
  // Every idle connection is busy in another thread.
  const Connected extra = connect();
  logDebug("TCPStore: opened another connection to {} for a concurrent request", hostPort());
  return extra.fd;
}

void Client::giveBack(int fd) {
  std::lock_guard<std::mutex> lock(mutex_);
  idle_.push_back(fd);
}

Bytes Client::request(uint8_t command, const std::vector<std::string>& keys, const Bytes& value,
                      std::chrono::milliseconds timeout) {
  const std::string payload = encodeRequest(command, keys, value);
  if (payload.size() > kMaxFrame) {
    fail<StoreError>("store {}: {} of {} bytes exceeds the {}-byte limit of a request", describe(),
                     commandName(command), payload.size(), kMaxFrame);
  }

  const auto deadline = Clock::now() + timeout;
  const int fd = borrow();
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
    fail<StoreTimeout>("store {}: no reply to {} of key '{}' within {} ms. HINT: {}", describe(), commandName(command),
                       keys.empty() ? "" : keys[0], timeout.count(), kRendezvousHelp);
  } catch (const ConnectionLost& e) {
    ::close(fd);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (lostReason_.empty()) lostReason_ = e.reason;
    }
    fail<StoreError>(
        "store {}: lost the connection to the store server during {} ({}). HINT: rank 0 serves the store; check "
        "whether it exited or crashed",
        describe(), commandName(command), e.reason);
  }
  if (status == kRefused) {
    ::close(fd);  // the server closes a connection it refuses
    fail<StoreError>("store {}: the server refused {}: {}", describe(), commandName(command), body);
  }
  giveBack(fd);
  if (status != kOk) throw StoreError(body);
  return Bytes(body.begin(), body.end());
}

}  // namespace ddp::tcpstore
