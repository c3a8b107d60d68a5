// Stores: the Store contract for HashStore, FileStore, TCPStore and EtcdStore alike,
// then what only TCPStore promises (errors that say what to fix, refusing
// rogue peers, failing instead of hanging, several processes).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <thread>

#include "framework/store/etcd/base64.hpp"
#include "framework/store/etcd_store.hpp"
#include "framework/store/file_store.hpp"
#include "framework/store/hash_store.hpp"
#include "framework/store/prefix_store.hpp"
#include "framework/store/tcp/auth.hpp"
#include "framework/store/tcp/wire.hpp"
#include "framework/store/tcp_store.hpp"
#include "tests/etcd_support.hpp"
#include "tests/test_support.hpp"

using namespace ddp;
using ddp::test::TempDir;
using Catch::Matchers::Contains;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

constexpr milliseconds kShortTimeout{200};
const std::string kToken = "test-token";

milliseconds since(Clock::time_point start) {
  return std::chrono::duration_cast<milliseconds>(Clock::now() - start);
}


TCPStoreOptions serverOptions(uint16_t port = 0) {
  TCPStoreOptions o;
  o.host = "127.0.0.1";
  o.port = port;  // 0: let the kernel pick, so parallel test runs never collide
  o.isServer = true;
  o.token = kToken;
  o.connectTimeout = milliseconds(5000);
  o.timeout = milliseconds(30000);
  return o;
}

EtcdStoreOptions etcdOptions(const std::string& endpoint, const std::string& prefix = "/ddp/test") {
  EtcdStoreOptions o;
  o.endpoints = {endpoint};
  o.prefix = prefix;
  o.token = kToken;
  o.connectTimeout = milliseconds(5000);
  o.timeout = milliseconds(30000);
  return o;
}

TCPStoreOptions clientOptions(uint16_t port) {
  TCPStoreOptions o = serverOptions(port);
  o.isServer = false;
  return o;
}

// One store under test: a first handle, and a way to open another handle on
// the same data (a second client, a second FileStore on the file), so that
// tests also cross handles the way separate ranks do.
struct StoreUnderTest {
  std::shared_ptr<Store> first;
  std::function<std::shared_ptr<Store>()> another;
};

const std::map<std::string, std::function<StoreUnderTest()>>& factories() {
  static const std::map<std::string, std::function<StoreUnderTest()>> table = {
      {"hash",
       [] {
         auto store = std::make_shared<HashStore>();
         return StoreUnderTest{store, [store] { return store; }};
       }},
      {"file",
       [] {
         auto dir = std::make_shared<TempDir>();
         const std::string path = dir->path() + "/store";
         // Each handle holds the directory, which goes with the last of them.
         auto open = [dir, path]() -> std::shared_ptr<Store> {
           auto* store = new FileStore(path);
           return std::shared_ptr<Store>(store, [dir](Store* s) { delete s; });
         };
         return StoreUnderTest{open(), open};
       }},
      {"tcp",
       [] {
         auto server = std::make_shared<TCPStore>(serverOptions());
         const uint16_t port = server->port();
         // Clients keep the server alive until the last of them is gone.
         auto open = [server, port]() -> std::shared_ptr<Store> {
           auto* client = new TCPStore(clientOptions(port));
           return std::shared_ptr<Store>(client, [server](Store* s) { delete s; });
         };
         return StoreUnderTest{server, open};
       }},
      {"etcd",
       [] {
         // Its own etcd, and a job prefix of its own in it.
         auto server = std::make_shared<test::EtcdServer>();
         auto open = [server]() -> std::shared_ptr<Store> {
           auto* client = new EtcdStore(etcdOptions(server->endpoint()));
           return std::shared_ptr<Store>(client, [server](Store* s) { delete s; });
         };
         return StoreUnderTest{open(), open};
       }},
  };
  return table;
}

StoreUnderTest makeStore(const std::string& kind) {
  StoreUnderTest s = factories().at(kind)();
  s.first->setTimeout(milliseconds(30000));
  return s;
}

// Runs f, which must throw StoreTimeout; returns how long it took and the message.
template <typename F>
std::pair<milliseconds, std::string> expectTimeout(F f) {
  const auto start = Clock::now();
  try {
    f();
  } catch (const StoreTimeout& e) {
    return {since(start), e.what()};
  }
  FAIL("expected StoreTimeout, nothing was thrown");
  return {};
}

// Runs f, which must throw a StoreError that is not a timeout.
template <typename F>
std::pair<milliseconds, std::string> expectStoreError(F f) {
  const auto start = Clock::now();
  try {
    f();
  } catch (const StoreTimeout& e) {
    FAIL("expected a StoreError other than a timeout, got: " << e.what());
  } catch (const StoreError& e) {
    return {since(start), e.what()};
  }
  FAIL("expected StoreError, nothing was thrown");
  return {};
}

// ---- raw sockets, for playing a misbehaving peer ---------------------------

int connectRaw(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    throw std::runtime_error("raw connect failed");
  }
  return fd;
}

void sendRaw(int fd, const std::string& bytes) {
  REQUIRE(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size()));
}

// Reads until the peer closes (true) or `limit` passes (false).
std::pair<bool, std::string> readUntilClosed(int fd, milliseconds limit) {
  std::string received;
  const auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    char buf[4096];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return {true, received};  // EOF, or a reset: closed either way
    received.append(buf, static_cast<size_t>(n));
  }
  return {false, received};
}

// One frame's payload, read within `limit` ("" when none came).
std::string readFrame(int fd, milliseconds limit) {
  std::string got;
  const auto deadline = Clock::now() + limit;
  auto want = [&](size_t n) {
    while (got.size() < n && Clock::now() < deadline) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      char buf[4096];
      const ssize_t r = ::recv(fd, buf, std::min(sizeof buf, n - got.size()), 0);
      if (r <= 0) return false;
      got.append(buf, static_cast<size_t>(r));
    }
    return got.size() >= n;
  };
  if (!want(4)) return "";
  const uint32_t len = ntohl(*reinterpret_cast<const uint32_t*>(got.data()));
  if (len > (1u << 20) || !want(4 + len)) return "";
  return got.substr(4);
}

// The client's side of the handshake (framework/store/tcp/wire.hpp) by hand,
// proving `token`; the server's last reply is left unread.
void rawHandshake(int fd, const std::string& token) {
  const std::string clientNonce = tcpstore::makeNonce();
  sendRaw(fd, tcpstore::helloFrame(clientNonce));
  const std::string challenge = readFrame(fd, milliseconds(5000));
  REQUIRE(challenge.size() == 1 + tcpstore::kNonceBytes + tcpstore::kProofBytes);
  const std::string serverNonce = challenge.substr(1, tcpstore::kNonceBytes);
  sendRaw(fd, tcpstore::frame(tcpstore::clientProof(token, clientNonce, serverNonce)));
}

// The server's count of refused connections once it reaches `n` (or after
// 5 s): a client may leave before the server has read its last frame.
int64_t refusalsReaching(const TCPStore& server, int64_t n) {
  const auto deadline = Clock::now() + milliseconds(5000);
  while (server.refusedConnections() < n && Clock::now() < deadline) std::this_thread::sleep_for(milliseconds(10));
  return server.refusedConnections();
}

// A local port with nobody listening on it.
uint16_t closedPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}


// Resident memory of this process, in bytes.
size_t residentBytes() {
  std::ifstream statm("/proc/self/statm");
  size_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<size_t>(::sysconf(_SC_PAGESIZE));
}

// Open file descriptors of this process.
size_t openFds() {
  size_t n = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    (void)entry;
    ++n;
  }
  return n;
}

// Sends up to `bytes` zero bytes, until the peer closes or `limit` passes;
// returns how many it accepted.
size_t sendZeros(int fd, size_t bytes, milliseconds limit) {
  const std::string chunk(1 << 20, '\0');
  const auto deadline = Clock::now() + limit;
  size_t sent = 0;
  while (sent < bytes && Clock::now() < deadline) {
    pollfd p{fd, POLLOUT, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    if (p.revents & (POLLERR | POLLHUP)) break;
    const ssize_t n = ::send(fd, chunk.data(), std::min(chunk.size(), bytes - sent), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  return sent;
}

std::string lengthPrefix(uint32_t len) {
  const uint32_t be = htonl(len);
  return std::string(reinterpret_cast<const char*>(&be), 4);
}

}  // namespace

// ============================================================================
// The Store contract, for every implementation
// ============================================================================

// stores round-trip values, empty and binary ones included.
void roundTrip(const std::string& kind) {
  INFO("store: " << kind);
  auto s = makeStore(kind);
  auto other = s.another();

  s.first->setString("greeting", "hello");
  CHECK(s.first->getString("greeting") == "hello");
  CHECK(other->getString("greeting") == "hello");

  s.first->set("empty", {});
  CHECK(s.first->get("empty").empty());
  CHECK(other->check({"empty"}));

  Bytes binary;
  for (int round = 0; round < 4; ++round) {
    for (int b = 0; b < 256; ++b) binary.push_back(static_cast<uint8_t>(b));  // NULs and high bytes
  }
  other->set("binary", binary);
  CHECK(s.first->get("binary") == binary);

  Bytes big(3 << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 7919 >> 3);
  s.first->set("big", big);
  CHECK(other->get("big") == big);

  other->setString("greeting", "overwritten");
  CHECK(s.first->getString("greeting") == "overwritten");
  CHECK(s.first->get("binary") == binary);  // other keys untouched
}

// get blocks until another thread sets the key.
void getBlocks(const std::string& kind) {
  INFO("store: " << kind);
  auto s = makeStore(kind);
  auto other = s.another();

  std::string setterError;
  const auto start = Clock::now();
  std::thread setter([&] {
    try {
      std::this_thread::sleep_for(milliseconds(150));
      other->setString("late", "arrived");
    } catch (const std::exception& e) {
      setterError = e.what();
    }
  });
  const std::string value = s.first->getString("late");
  const auto waited = since(start);
  setter.join();
  REQUIRE(setterError.empty());
  CHECK(value == "arrived");
  CHECK(waited >= milliseconds(100));
  CHECK(waited < milliseconds(5000));

  // wait() on several keys returns once the last one appears.
  s.first->setString("w1", "x");
  std::thread late([&] {
    std::this_thread::sleep_for(milliseconds(100));
    try {
      other->setString("w2", "y");
    } catch (const std::exception& e) {
      setterError = e.what();
    }
  });
  s.first->wait({"w1", "w2"}, milliseconds(10000));
  late.join();
  REQUIRE(setterError.empty());
  CHECK(s.first->check({"w1", "w2"}));
}

// add is atomic across threads and handles.
void addIsAtomic(const std::string& kind) {
  INFO("store: " << kind);
  auto s = makeStore(kind);

  constexpr int kThreads = 4;
  constexpr int kIncrements = 100;
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    // Half the threads share the first handle, half have their own.
    std::shared_ptr<Store> handle = t % 2 == 0 ? s.first : s.another();
    threads.emplace_back([&errors, handle, t] {
      try {
        for (int i = 0; i < kIncrements; ++i) handle->add("counter", 1);
      } catch (const std::exception& e) {
        errors[t] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors) CHECK(e.empty());

  CHECK(s.first->add("counter", 0) == kThreads * kIncrements);
  CHECK(s.first->getString("counter") == "400");  // counters are decimal text in every store
  CHECK(s.first->add("counter", -50) == 350);
  CHECK(s.first->add("fresh", 5) == 5);

  s.first->setString("text", "not a number");
  CHECK_THROWS_AS(s.first->add("text", 1), StoreError);
  CHECK(s.first->add("counter", 0) == 350);  // still usable after the error
}

// check reports whether every key exists, without blocking.
void checkDoesNotBlock(const std::string& kind) {
  INFO("store: " << kind);
  auto s = makeStore(kind);
  auto other = s.another();

  CHECK(s.first->check({}));
  CHECK_FALSE(s.first->check({"x"}));
  s.first->setString("x", "1");
  CHECK(s.first->check({"x"}));
  CHECK(other->check({"x"}));
  CHECK_FALSE(s.first->check({"x", "y"}));
  other->setString("y", "2");
  CHECK(s.first->check({"x", "y", "x"}));
}

// wait and get time out with StoreTimeout.
void waitTimesOut(const std::string& kind) {
  INFO("store: " << kind);
  auto s = makeStore(kind);
  s.first->setString("present", "1");

  s.first->wait({"present"}, kShortTimeout);  // present: returns at once

  auto [waited, message] = expectTimeout([&] { s.first->wait({"present", "missing"}, kShortTimeout); });
  CHECK(waited >= milliseconds(190));
  CHECK(waited < milliseconds(2000));
  CHECK_THAT(message, Contains("missing") && Contains(s.first->describe()) && Contains("200 ms"));
  CHECK_THAT(message, Contains("docs/clusters.md#diagnosing-a-rendezvous-that-does-not-complete"));

  s.first->setTimeout(kShortTimeout);
  std::tie(waited, message) = expectTimeout([&] { s.first->get("absent"); });
  CHECK(waited >= milliseconds(190));
  CHECK(waited < milliseconds(2000));
  CHECK_THAT(message, Contains("absent"));

  // A timeout leaves the store usable.
  s.first->setString("missing", "now");
  s.first->wait({"present", "missing"}, kShortTimeout);
  CHECK(s.first->getString("missing") == "now");
}

// PrefixStore keeps namespaces apart.
void prefixesApart(const std::string& kind) {
  INFO("store: " << kind);
  auto s = makeStore(kind);
  PrefixStore a("a", s.first);
  PrefixStore b("b", s.another());

  a.setString("k", "from a");
  CHECK(a.check({"k"}));
  CHECK_FALSE(b.check({"k"}));
  CHECK(s.first->check({"a/k"}));
  CHECK(s.first->getString("a/k") == "from a");

  b.setString("k", "from b");
  CHECK(a.getString("k") == "from a");
  CHECK(b.getString("k") == "from b");

  CHECK(a.add("n", 1) == 1);
  CHECK(b.add("n", 5) == 5);
  CHECK(a.add("n", 0) == 1);

  a.setString("only-in-a", "1");
  auto [waited, message] = expectTimeout([&] { b.wait({"only-in-a"}, kShortTimeout); });
  CHECK(waited < milliseconds(2000));
  CHECK_THAT(message, Contains("b/only-in-a"));
}

TEST_CASE("stores round-trip values, empty and binary ones included", "[store]") {
  roundTrip(GENERATE(as<std::string>{}, "hash", "file", "tcp"));
}

TEST_CASE("get blocks until another thread sets the key", "[store]") {
  getBlocks(GENERATE(as<std::string>{}, "hash", "file", "tcp"));
}

TEST_CASE("add is atomic across threads and handles", "[store]") {
  addIsAtomic(GENERATE(as<std::string>{}, "hash", "file", "tcp"));
}

TEST_CASE("check reports whether every key exists, without blocking", "[store]") {
  checkDoesNotBlock(GENERATE(as<std::string>{}, "hash", "file", "tcp"));
}

TEST_CASE("wait and get time out with StoreTimeout", "[store]") {
  waitTimesOut(GENERATE(as<std::string>{}, "hash", "file", "tcp"));
}

TEST_CASE("PrefixStore keeps namespaces apart", "[store]") {
  prefixesApart(GENERATE(as<std::string>{}, "hash", "file", "tcp"));
}

TEST_CASE("EtcdStore: the Store contract, as every store keeps it", "[store][etcd][solo]") {
  const std::string whyNot = test::EtcdServer::whyNot();
  if (!whyNot.empty()) {
    WARN("SKIPPED: " << whyNot);
    return;
  }
  SECTION("round trip") { roundTrip("etcd"); }
  SECTION("get blocks") { getBlocks("etcd"); }
  SECTION("add is atomic") { addIsAtomic("etcd"); }
  SECTION("check") { checkDoesNotBlock("etcd"); }
  SECTION("timeouts") { waitTimesOut("etcd"); }
  SECTION("prefixes") { prefixesApart("etcd"); }
}

TEST_CASE("EtcdStore: tokens, endpoints, a run's lifetime, and an etcd that goes away", "[store][etcd][solo]") {
  const std::string whyNot = test::EtcdServer::whyNot();
  if (!whyNot.empty()) {
    WARN("SKIPPED: " << whyNot);
    return;
  }
  test::EtcdServer etcd;
  SECTION("a handle with another token is refused at once, with a hint") {
    EtcdStore job(etcdOptions(etcd.endpoint(), "/ddp/tokens"));
    auto other = etcdOptions(etcd.endpoint(), "/ddp/tokens");
    other.token = "another-token";
    auto [took, message] = expectStoreError([&] { EtcdStore refused(other); });
    CHECK(took < milliseconds(3000));
    CHECK_THAT(message, Contains("another store token") && Contains("HINT") && Contains("/ddp/tokens"));
    // Another job id is another run, whatever its token.
    other.prefix = "/ddp/tokens2";
    EtcdStore separate(other);
    job.setString("k", "1");
    CHECK_FALSE(separate.check({"k"}));
  }
  SECTION("URLs: endpoints and prefix, and what is wrong with a bad one") {
    EtcdStoreOptions o;
    parseEtcdUrl("etcd://10.0.0.1:2379,[::1]:2380/ddp/job7/", &o);
    CHECK(o.endpoints == std::vector<std::string>{"10.0.0.1:2379", "[::1]:2380"});
    CHECK(o.prefix == "/ddp/job7");
    CHECK(formatEtcdUrl(o) == "etcd://10.0.0.1:2379,[::1]:2380/ddp/job7");
    CHECK_THROWS_WITH(parseEtcdUrl("http://h:1", &o), Contains("expected etcd://"));
    CHECK_THROWS_WITH(parseEtcdUrl("etcd://host/ddp", &o), Contains("has no port"));
    CHECK_THROWS_WITH(parseEtcdUrl("etcd://host:99999", &o), Contains("port 1-65535"));
    CHECK_THROWS_WITH(parseEtcdUrl("etcd://h:1,,h:2", &o), Contains("empty endpoint"));
  }
  SECTION("an endpoint that does not answer is passed over for the next") {
    auto o = etcdOptions("127.0.0.1:1", "/ddp/endpoints");
    o.endpoints.push_back(etcd.endpoint());
    EtcdStore store(o);
    store.setString("k", "v");
    CHECK(store.getString("k") == "v");
    CHECK(store.add("n", 2) == 2);
  }
  SECTION("nobody answers: fails after connectTimeout, naming the endpoints") {
    auto o = etcdOptions("127.0.0.1:1", "/ddp/none");
    o.connectTimeout = milliseconds(300);
    auto [took, message] = expectStoreError([&] { EtcdStore unreachable(o); });
    CHECK(took >= milliseconds(290));
    CHECK(took < milliseconds(3000));
    CHECK_THAT(message, Contains("127.0.0.1:1") && Contains("cannot reach etcd") && Contains("HINT"));
  }
  SECTION("a value over etcd's request limit fails with a hint") {
    EtcdStore store(etcdOptions(etcd.endpoint(), "/ddp/big"));
    auto [took, message] = expectStoreError([&] { store.set("huge", Bytes(17 << 20, 'x')); });
    CHECK_THAT(message, Contains("--max-request-bytes") && Contains("huge"));
    store.setString("small", "still works");
    CHECK(store.getString("small") == "still works");
  }
  SECTION("check over more keys than one etcd transaction holds; add(key, 0) reads, writing nothing") {
    EtcdStore store(etcdOptions(etcd.endpoint(), "/ddp/many"));
    std::vector<std::string> keys;
    for (int i = 0; i < 300; ++i) keys.push_back(fmt::format("k{}", i));
    for (const auto& k : keys) store.setString(k, "1");
    CHECK(store.check(keys));
    keys.push_back("missing");
    CHECK_FALSE(store.check(keys));
    CHECK(store.add("absent", 0) == 0);
    CHECK_FALSE(store.check({"absent"}));
    CHECK(store.add("n", 3) == 3);
    CHECK(store.add("n", 0) == 3);
  }
  SECTION("the run's keys outlive its last handle by the lease, then go") {
    auto o = etcdOptions(etcd.endpoint(), "/ddp/lease");
    o.leaseTtl = std::chrono::seconds(1);
    // Whether the key is there, looked at from outside (a handle would join
    // the run and renew its lease).
    auto present = [&] {
      etcd::HttpConnection c("127.0.0.1", static_cast<uint16_t>(etcd.clientPort()), Clock::now() + milliseconds(2000));
      const std::string body = fmt::format(R"({{"key":"{}","count_only":true}})", etcd::base64Encode("/ddp/lease/kv/k"));
      return c.post("/v3/kv/range", body, Clock::now() + milliseconds(2000)).body.find("\"count\"") != std::string::npos;
    };
    int64_t firstLease = 0;
    {
      EtcdStore a(o);
      EtcdStore b(o);
      CHECK(a.leaseId() == b.leaseId());  // one run
      firstLease = a.leaseId();
      a.setString("k", "v");
      CHECK(present());
      // Kept alive while a handle lives, well past the TTL.
      std::this_thread::sleep_for(milliseconds(2500));
      CHECK(b.getString("k") == "v");
      CHECK(present());
    }
    // Gone a TTL after the last handle (etcd checks leases about every 0.5 s).
    const auto deadline = Clock::now() + milliseconds(8000);
    bool gone = false;
    while (!gone && Clock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(250));
      gone = !present();
    }
    CHECK(gone);
    EtcdStore fresh(o);
    CHECK(fresh.leaseId() != firstLease);
    CHECK_FALSE(fresh.check({"k"}));
  }
  SECTION("etcd killed while a get waits: StoreError, not a hang") {
    auto o = etcdOptions(etcd.endpoint(), "/ddp/dies");
    o.connectTimeout = milliseconds(1000);
    EtcdStore store(o);
    std::thread killer([&] {
      std::this_thread::sleep_for(milliseconds(300));
      etcd.stop();
    });
    const auto start = Clock::now();
    std::string message;
    try {
      store.get("never");
    } catch (const StoreError& e) {
      message = e.what();
    }
    killer.join();
    CHECK(since(start) < milliseconds(10000));
    CHECK_THAT(message, Contains("cannot reach etcd") && Contains(etcd.endpoint()));
  }
}

// ============================================================================
// FileStore
// ============================================================================

TEST_CASE("FileStore: a missing directory fails, naming the path", "[store][file]") {
  TempDir dir;
  const std::string path = dir.path() + "/no-such-dir/store";
  auto [took, message] = expectStoreError([&] { FileStore store(path); });
  CHECK_THAT(message, Contains(path) && Contains("No such file or directory"));
}

TEST_CASE("FileStore: refuses a file that is not a store, survives a torn record", "[store][file]") {
  TempDir dir;
  const std::string foreign = dir.path() + "/notes.txt";
  std::ofstream(foreign) << "precious notes, not a store\n";
  auto [took, message] = expectStoreError([&] { FileStore store(foreign); });
  CHECK_THAT(message, Contains(foreign) && Contains("not a store file"));

  const std::string path = dir.path() + "/store";
  {
    FileStore store(path);
    store.setString("a", "1");
  }
  // A writer killed mid-record leaves a partial record at the end.
  std::ofstream(path, std::ios::app | std::ios::binary) << std::string("\x05\0\0\0\0\0\0\0ab", 10);
  FileStore store(path);
  CHECK(store.getString("a") == "1");
  store.setString("b", "2");
  CHECK(store.getString("b") == "2");
  CHECK(FileStore(path).getString("a") == "1");
}

// ============================================================================
// TCPStore
// ============================================================================

TEST_CASE("TCPStore: a port in use fails at once, naming the port", "[store][tcp]") {
  TCPStore first(serverOptions());
  const uint16_t port = first.port();
  REQUIRE(port != 0);
  auto [took, message] = expectStoreError([&] { TCPStore second(serverOptions(port)); });
  CHECK(took < milliseconds(1000));
  CHECK_THAT(message, Contains(std::to_string(port)) && Contains("in use") && Contains("HINT:") &&
                          Contains("MASTER_PORT"));
  first.setString("still", "serving");
  CHECK(first.getString("still") == "serving");
}

TEST_CASE("TCPStore: an unreachable master fails after connectTimeout, naming host:port", "[store][tcp]") {
  const uint16_t port = closedPort();
  TCPStoreOptions options = clientOptions(port);
  options.connectTimeout = milliseconds(500);
  auto [took, message] = expectStoreError([&] { TCPStore client(options); });
  CHECK(took >= milliseconds(450));
  CHECK(took < milliseconds(3000));
  CHECK_THAT(message, Contains("127.0.0.1:" + std::to_string(port)) && Contains("Connection refused") &&
                          Contains("HINT:") && Contains("MASTER_ADDR"));
  CHECK_THAT(message, Contains("docs/clusters.md#diagnosing-a-rendezvous-that-does-not-complete"));
}

TEST_CASE("TCPStore: a client without a token is told that the store requires one", "[store][tcp]") {
  TCPStore server(serverOptions());
  TCPStoreOptions options = clientOptions(server.port());
  options.token = "";
  options.tokenFromEnvironment = false;
  auto [took, message] = expectStoreError([&] { TCPStore client(options); });
  CHECK(took < milliseconds(2000));
  CHECK_THAT(message, Contains("this process has no DDP_STORE_TOKEN and the store server at 127.0.0.1:" +
                               std::to_string(server.port()) + " requires one") &&
                          Contains("HINT: export DDP_STORE_TOKEN"));
  CHECK_FALSE(Contains("another job's store").match(message));
}

TEST_CASE("TCPStore: a client with the wrong token is refused with a hint", "[store][tcp]") {
  TCPStore server(serverOptions());
  TCPStoreOptions options = clientOptions(server.port());
  options.token = "some-other-job";
  auto [took, message] = expectStoreError([&] { TCPStore client(options); });
  CHECK(took < milliseconds(2000));  // a refusal is final, not retried
  // The server proves the token first, so the client finds the mismatch.
  CHECK_THAT(message, Contains("store server at 127.0.0.1:" + std::to_string(server.port())) &&
                          Contains("does not know this job's token") && Contains("HINT:") &&
                          Contains(kStoreTokenEnv));
  CHECK(refusalsReaching(server, 1) == 1);  // and the server logs it as a wrong token
}

TEST_CASE("TCPStore: the token comes from DDP_STORE_TOKEN unless given", "[store][tcp]") {
  const char* saved = std::getenv(kStoreTokenEnv);
  const std::string savedValue = saved ? saved : "";
  ::setenv(kStoreTokenEnv, "from-env", 1);
  TCPStoreOptions options = serverOptions();
  options.token.clear();
  TCPStore server(options);

  TCPStoreOptions explicitSame = clientOptions(server.port());
  explicitSame.token = "from-env";
  TCPStore client(explicitSame);
  client.setString("k", "v");
  CHECK(server.getString("k") == "v");

  TCPStoreOptions ignoringEnv = clientOptions(server.port());
  ignoringEnv.token.clear();
  ignoringEnv.tokenFromEnvironment = false;  // token "" != "from-env"
  expectStoreError([&] { TCPStore rejected(ignoringEnv); });
  CHECK(refusalsReaching(server, 1) == 1);

  if (saved) {
    ::setenv(kStoreTokenEnv, savedValue.c_str(), 1);
  } else {
    ::unsetenv(kStoreTokenEnv);
  }
}

TEST_CASE("TCPStore: rogue peers are refused and the others keep working", "[store][tcp]") {
  TCPStore server(serverOptions());
  const uint16_t port = server.port();
  TCPStore client(clientOptions(port));

  // A legitimate get that stays pending while the rogues come and go.
  std::string pendingValue, pendingError;
  std::thread pending([&] {
    try {
      pendingValue = client.getString("after-rogues");
    } catch (const std::exception& e) {
      pendingError = e.what();
    }
  });

  // A peer that connects and stalls mid-header must not hold anybody up.
  const int stalled = connectRaw(port);
  sendRaw(stalled, std::string("\0\0", 2));

  const int wrongToken = connectRaw(port);
  rawHandshake(wrongToken, "guessed-token");
  auto [closed1, reply1] = readUntilClosed(wrongToken, milliseconds(5000));
  ::close(wrongToken);
  CHECK(closed1);
  CHECK_THAT(reply1, Contains("wrong job token"));

  const int http = connectRaw(port);  // "GET " reads as a ~1.1 GiB frame length
  sendRaw(http, "GET / HTTP/1.1\r\nHost: localhost\r\n\r\n");
  auto [closed2, reply2] = readUntilClosed(http, milliseconds(5000));
  ::close(http);
  CHECK(closed2);
  CHECK_THAT(reply2, Contains("exceeds"));

  const int garbage = connectRaw(port);
  sendRaw(garbage, std::string("\0\0\0\x06garbag", 10));
  auto [closed3, reply3] = readUntilClosed(garbage, milliseconds(5000));
  ::close(garbage);
  CHECK(closed3);
  CHECK_THAT(reply3, Contains("malformed handshake"));

  // The right token, then a request claiming 2^32-1 keys: refused after the handshake.
  const int malformed = connectRaw(port);
  rawHandshake(malformed, kToken);
  sendRaw(malformed, std::string("\0\0\0\x05\x02\xff\xff\xff\xff", 9));
  auto [closed4, reply4] = readUntilClosed(malformed, milliseconds(5000));
  ::close(malformed);
  CHECK(closed4);
  CHECK_THAT(reply4, Contains("malformed request"));

  CHECK(server.refusedConnections() == 4);

  // Old and new legitimate clients alike are still served.
  TCPStore late(clientOptions(port));
  late.setString("after-rogues", "served");
  pending.join();
  CHECK(pendingError.empty());
  CHECK(pendingValue == "served");
  CHECK(client.add("n", 2) == 2);
  CHECK(server.add("n", 3) == 5);
  ::close(stalled);
}

TEST_CASE("TCPStore: a huge frame before the handshake is refused without being buffered", "[store][tcp]") {
  TCPStore server(serverOptions());
  const uint16_t port = server.port();
  const size_t before = residentBytes();
  // Just under 1 GiB announced, then 64 MiB of it sent: the server must
  // close at the length, not buffer what follows.
  const int rogue = connectRaw(port);
  sendRaw(rogue, lengthPrefix((1u << 30) - 16));
  sendZeros(rogue, 64u << 20, milliseconds(5000));
  auto [closed, reply] = readUntilClosed(rogue, milliseconds(5000));
  ::close(rogue);
  CHECK(closed);
  CHECK_THAT(reply, Contains("handshake frame") && Contains("exceeds"));
  const size_t grown = residentBytes() - std::min(before, residentBytes());
  INFO("resident memory grew by " << grown << " bytes");
  CHECK(grown < (16u << 20));
  // The store still serves.
  TCPStore client(clientOptions(port));
  client.setString("k", "v");
  CHECK(server.getString("k") == "v");
  CHECK(server.refusedConnections() == 1);
}

TEST_CASE("TCPStore: after the handshake, a frame over the request limit is refused", "[store][tcp]") {
  TCPStore server(serverOptions());
  const uint16_t port = server.port();
  const int rogue = connectRaw(port);
  rawHandshake(rogue, kToken);
  sendRaw(rogue, lengthPrefix(512u << 20));
  auto [closed, reply] = readUntilClosed(rogue, milliseconds(5000));
  ::close(rogue);
  CHECK(closed);
  CHECK_THAT(reply, Contains("exceeds") && Contains(std::to_string(64u << 20)));
  TCPStore client(clientOptions(port));
  client.setString("k", "v");
  CHECK(client.getString("k") == "v");
}

TEST_CASE("TCPStore: connections that never shake hands are capped, oldest closed first", "[store][tcp]") {
  ddp::test::CapturedStderr captured;
  auto server = std::make_unique<TCPStore>(serverOptions());
  const uint16_t port = server->port();
  const size_t before = openFds();
  std::vector<int> idle;
  for (int i = 0; i < 200; ++i) idle.push_back(connectRaw(port));
  // A real client still gets in, and once it has, the server has accepted every idle one.
  TCPStore client(clientOptions(port));
  client.setString("k", "v");
  CHECK(server->getString("k") == "v");
  const size_t used = openFds() - before;
  // Ours: 200 idle sockets and the client's; the server's: at most 64
  // pending, the client's two and a few of its own.
  INFO("descriptors opened: " << used);
  CHECK(used <= 200 + 64 + 8);
  int closedByServer = 0;
  for (int fd : idle) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 0) > 0) {
      char byte;
      if (::recv(fd, &byte, 1, MSG_PEEK) >= 0) ++closedByServer;  // the refusal, or EOF
    }
  }
  CHECK(closedByServer >= 200 - 64);
  CHECK(server->refusedConnections() >= 200 - 64);
  for (int fd : idle) ::close(fd);
  server.reset();
  const std::string log = captured.restore();
  const auto lines = std::count(log.begin(), log.end(), '\n');
  INFO(log);
  CHECK(lines <= 8);
  CHECK_THAT(log, Contains("more connection"));
}

TEST_CASE("TCPStore: a server that does not know the token gets neither token nor proof", "[store][tcp]") {
  // A fake server on the port (one that took it first, say): it answers the
  // hello with a made-up proof and records what the client sends.
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::listen(listener, 4) == 0);
  socklen_t len = sizeof addr;
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  const uint16_t port = ntohs(addr.sin_port);
  std::string received;
  std::thread fake([&] {
    const int fd = ::accept(listener, nullptr, nullptr);
    if (fd < 0) return;
    received = readFrame(fd, milliseconds(5000));
    const std::string madeUp(tcpstore::kNonceBytes + tcpstore::kProofBytes, '\x5a');
    const std::string reply = tcpstore::replyFrame(tcpstore::kOk, madeUp);
    ::send(fd, reply.data(), reply.size(), MSG_NOSIGNAL);  // no REQUIRE off the test's thread
    received += readUntilClosed(fd, milliseconds(5000)).second;
    ::close(fd);
  });
  auto [took, message] = expectStoreError([&] { TCPStore client(clientOptions(port)); });
  fake.join();
  ::close(listener);
  CHECK_THAT(message, Contains("127.0.0.1:" + std::to_string(port)) && Contains("does not know this job's token") &&
                          Contains("HINT:"));
  CHECK(took < milliseconds(3000));
  CHECK(received.find(kToken) == std::string::npos);  // the token never travels
  // After the hello, only an empty frame: no proof to try guesses against.
  CHECK(received.size() == 9 + tcpstore::kNonceBytes + 4);
}

TEST_CASE("TCPStore: SHA-256 and HMAC-SHA-256 match published test vectors", "[store][tcp]") {
  auto hex = [](const std::string& bytes) {
    std::string out;
    for (unsigned char c : bytes) out += fmt::format("{:02x}", c);
    return out;
  };
  CHECK(hex(tcpstore::sha256("abc")) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(hex(tcpstore::sha256("")) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(hex(tcpstore::sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")) ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // RFC 4231, test cases 1 and 2.
  CHECK(hex(tcpstore::hmacSha256(std::string(20, '\x0b'), "Hi There")) ==
        "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  CHECK(hex(tcpstore::hmacSha256("Jefe", "what do ya want for nothing?")) ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST_CASE("TCPStore: a blocked get fails, not hangs, when the server goes away", "[store][tcp]") {
  auto server = std::make_unique<TCPStore>(serverOptions());
  const uint16_t port = server->port();
  TCPStore client(clientOptions(port));  // timeout 30 s: far longer than the test allows

  std::string error;
  bool timedOut = false;
  milliseconds blocked{0};
  std::thread waiter([&] {
    const auto start = Clock::now();
    try {
      client.get("never-set");
    } catch (const StoreTimeout& e) {
      timedOut = true;
      error = e.what();
    } catch (const StoreError& e) {
      error = e.what();
    }
    blocked = since(start);
  });
  std::this_thread::sleep_for(milliseconds(200));
  server.reset();
  waiter.join();

  CHECK_FALSE(timedOut);
  CHECK_THAT(error, Contains("127.0.0.1:" + std::to_string(port)));
  CHECK(blocked < milliseconds(5000));

  // Later calls fail at once too.
  auto [took, message] = expectStoreError([&] { client.setString("k", "v"); });
  CHECK(took < milliseconds(1000));
  CHECK_THAT(message, Contains("gone away"));
}

TEST_CASE("TCPStore: ranks in separate processes share one store", "[store][tcp]") {
  TCPStore server(serverOptions());
  const uint16_t port = server.port();
  constexpr int kChildren = 3;

  std::vector<pid_t> children;
  for (int i = 0; i < kChildren; ++i) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      // Child: no Catch2 here (its state belongs to the parent); report by exit code.
      ::alarm(30);  // a hung child dies instead of hanging the test
      int code = 1;
      try {
        TCPStore store(clientOptions(port));
        store.add("counter", 1);
        store.wait({"go"});
        store.setString("done/" + std::to_string(i), store.getString("go"));
        code = 0;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "child %d: %s\n", i, e.what());
      }
      ::_exit(code);
    }
    children.push_back(pid);
  }

  // Every child has checked in before the go signal.
  const auto deadline = Clock::now() + milliseconds(20000);
  int64_t arrived = 0;
  while ((arrived = server.add("counter", 0)) < kChildren && Clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  CHECK(arrived == kChildren);
  server.setString("go", "now");

  for (pid_t pid : children) {
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    INFO("child pid " << pid << " status " << status);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
  for (int i = 0; i < kChildren; ++i) CHECK(server.getString("done/" + std::to_string(i)) == "now");
}

// ---- what a rendezvous logs --------------------------------------------------

namespace {

// Runs the hidden "[.store_log_worker]" case in a fresh copy of this binary
// (the log level is read once per process) with DDP_LOG_LEVEL = `level`
// (nullptr: unset); returns its exit code and everything it wrote to stderr.
std::pair<int, std::string> runLogWorker(const char* level) {
  int pipeFds[2];
  REQUIRE(::pipe(pipeFds) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::dup2(pipeFds[1], STDERR_FILENO);
    const int devNull = ::open("/dev/null", O_WRONLY);
    if (devNull >= 0) ::dup2(devNull, STDOUT_FILENO);  // Catch's report of the worker
    ::close(pipeFds[0]);
    ::close(pipeFds[1]);
    if (level) {
      ::setenv("DDP_LOG_LEVEL", level, 1);
    } else {
      ::unsetenv("DDP_LOG_LEVEL");
    }
    ::alarm(30);  // a hung worker dies instead of hanging the test
    ::execl("/proc/self/exe", "ddp_tests", "[.store_log_worker]", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(pipeFds[1]);
  std::string err;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(pipeFds[0], buf, sizeof buf)) != 0) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    err.append(buf, static_cast<size_t>(n));
  }
  ::close(pipeFds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status), err};
}

}  // namespace

// A rank that starts before rank 0's server: its client retries until the
// server appears 300 ms later. The port goes to stderr for the parent.
TEST_CASE("worker: a client that waits for the server", "[.store_log_worker]") {
  const uint16_t port = closedPort();
  std::fprintf(stderr, "worker port %u\n", static_cast<unsigned>(port));
  std::string clientError;
  std::atomic<bool> connecting{false};
  std::thread early([&] {
    try {
      TCPStoreOptions options = clientOptions(port);
      connecting = true;
      TCPStore client(options);
      client.setString("early", "here");
    } catch (const std::exception& e) {
      clientError = e.what();
    }
  });
  // The server comes 300 ms after the client started connecting (however
  // late a busy machine ran the client's thread).
  while (!connecting.load()) std::this_thread::sleep_for(milliseconds(1));
  std::this_thread::sleep_for(milliseconds(300));
  TCPStore server(serverOptions(port));
  early.join();
  REQUIRE(clientError.empty());
  CHECK(server.getString("early") == "here");
}

TEST_CASE("TCPStore: DDP_LOG_LEVEL=info shows where the store listens and who connected when", "[store][tcp][solo]") {
  auto [code, err] = runLogWorker("info");
  INFO("worker stderr:\n" << err);
  REQUIRE(code == 0);
  unsigned port = 0;
  const auto at = err.find("worker port ");
  REQUIRE(at != std::string::npos);
  REQUIRE(std::sscanf(err.c_str() + at, "worker port %u", &port) == 1);
  const std::string where = "127.0.0.1:" + std::to_string(port);
  CHECK_THAT(err, Contains("ddp[info] TCPStore: server listening on " + where + "\n"));

  // Two clients: the early one retried, the server's own did not need to.
  std::vector<std::pair<long, int>> connects;  // (ms, attempts)
  const std::string prefix = "ddp[info] TCPStore: connected to " + where + " after ";
  for (size_t pos = err.find(prefix); pos != std::string::npos; pos = err.find(prefix, pos + 1)) {
    long ms = -1;
    int attempts = -1;
    REQUIRE(std::sscanf(err.c_str() + pos + prefix.size(), "%ld ms (%d attempt", &ms, &attempts) == 2);
    connects.emplace_back(ms, attempts);
  }
  REQUIRE(connects.size() == 2);
  std::sort(connects.begin(), connects.end());
  CHECK(connects[0].second == 1);
  CHECK_THAT(err, Contains(" ms (1 attempt)\n"));
  CHECK(connects[1].first >= 250);  // started 300 ms before the server
  CHECK(connects[1].second >= 2);
  CHECK_THAT(err, Contains(" attempts)\n"));
}

TEST_CASE("TCPStore: a rendezvous logs nothing at the default log level", "[store][tcp]") {
  auto [code, err] = runLogWorker(nullptr);
  INFO("worker stderr:\n" << err);
  REQUIRE(code == 0);
  CHECK(err.find("worker port ") != std::string::npos);
  CHECK(err.find("ddp[") == std::string::npos);
}

TEST_CASE("EtcdStore: base64 as etcd's gateway carries bytes", "[store][etcd]") {
  using etcd::base64Decode;
  using etcd::base64Encode;
  // RFC 4648's test vectors.
  const std::vector<std::pair<std::string, std::string>> vectors = {
      {"", ""}, {"f", "Zg=="}, {"fo", "Zm8="}, {"foo", "Zm9v"}, {"foob", "Zm9vYg=="}, {"fooba", "Zm9vYmE="},
      {"foobar", "Zm9vYmFy"}};
  for (const auto& [plain, coded] : vectors) {
    CHECK(base64Encode(plain) == coded);
    CHECK(base64Decode(coded) == plain);
  }
  std::string every;
  for (int b = 0; b < 256; ++b) every += static_cast<char>(b);
  for (size_t n = 0; n <= every.size(); n += 37) CHECK(base64Decode(base64Encode(every.substr(0, n))) == every.substr(0, n));
  CHECK_THROWS_AS(base64Decode("Zm9"), std::invalid_argument);
  CHECK_THROWS_AS(base64Decode("Zm9*"), std::invalid_argument);
  CHECK_THROWS_AS(base64Decode("Z=9v"), std::invalid_argument);
}
