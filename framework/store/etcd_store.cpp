#include "framework/store/etcd_store.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <thread>

#include "framework/core/errors.hpp"
#include "framework/core/log.hpp"
#include "framework/store/etcd/base64.hpp"
#include "framework/store/etcd/http.hpp"
#include "framework/store/store_util.hpp"
#include "framework/store/tcp/auth.hpp"
#include "framework/store/tcp_store.hpp"  // kStoreTokenEnv

namespace ddp {

using json = nlohmann::json;
using etcd::base64Decode;
using etcd::base64Encode;
using etcd::HttpConnection;
using tcpstore::Clock;
using tcpstore::ConnectionLost;
using tcpstore::IoTimeout;

// One etcd member's client address (named: a member of Impl).
struct EtcdEndpoint {
  std::string host;
  uint16_t port = 0;
  std::string text;
};

namespace {

EtcdEndpoint parseEndpoint(const std::string& text, const std::string& where) {
  // "host:port", "[v6]:port"
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || text.find(']', colon) != std::string::npos) {
    fail<UsageError>("{}: etcd endpoint '{}' has no port. HINT: HOST:PORT, as etcd's --listen-client-urls "
                     "(2379 by default)",
                     where, text);
  }
  std::string host = text.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  char* end = nullptr;
  const long port = std::strtol(text.c_str() + colon + 1, &end, 10);
  if (*end != '\0' || port < 1 || port > 65535 || end == text.c_str() + colon + 1) {
    fail<UsageError>("{}: etcd endpoint '{}': expected a port 1-65535", where, text);
  }
  return {host, static_cast<uint16_t>(port), text};
}

std::string hex(const std::string& bytes) {
  std::string out;
  for (unsigned char c : bytes) out += fmt::format("{:02x}", c);
  return out;
}

// etcd's gateway writes int64 as strings, and leaves out zeros and empties.
int64_t number(const json& object, const char* name) {
  auto it = object.find(name);
  if (it == object.end()) return 0;
  if (it->is_string()) return std::strtoll(it->get<std::string>().c_str(), nullptr, 10);
  if (it->is_number()) return it->get<int64_t>();
  return 0;
}

std::string bytesField(const json& object, const char* name) {
  auto it = object.find(name);
  if (it == object.end() || !it->is_string()) return "";
  return base64Decode(it->get<std::string>());
}

std::string toString(const Bytes& b) { return std::string(b.begin(), b.end()); }
Bytes toBytes(const std::string& s) { return Bytes(s.begin(), s.end()); }

}  // namespace

void parseEtcdUrl(const std::string& url, EtcdStoreOptions* options) {
  const std::string scheme = "etcd://";
  if (url.rfind(scheme, 0) != 0) {
    fail<UsageError>("store URL '{}': expected etcd://HOST:PORT[,HOST:PORT...][/PREFIX]", url);
  }
  const std::string rest = url.substr(scheme.size());
  const size_t slash = rest.find('/');
  const std::string hosts = rest.substr(0, slash);
  options->endpoints.clear();
  size_t start = 0;
  while (start <= hosts.size()) {
    const size_t comma = std::min(hosts.find(',', start), hosts.size());
    const std::string one = hosts.substr(start, comma - start);
    if (one.empty()) fail<UsageError>("store URL '{}': an empty endpoint", url);
    parseEndpoint(one, "store URL '" + url + "'");
    options->endpoints.push_back(one);
    start = comma + 1;
  }
  if (slash != std::string::npos && slash + 1 < rest.size()) {
    options->prefix = rest.substr(slash);
    while (options->prefix.size() > 1 && options->prefix.back() == '/') options->prefix.pop_back();
  }
}

std::string formatEtcdUrl(const EtcdStoreOptions& options) {
  return fmt::format("etcd://{}{}", fmt::join(options.endpoints, ","), options.prefix);
}

class EtcdStore::Impl {
 public:
  explicit Impl(EtcdStoreOptions options) : options_(std::move(options)) {
    timeoutMs_ = options_.timeout.count();
    if (options_.endpoints.empty()) throw UsageError("EtcdStore: no etcd endpoint given");
    for (const auto& e : options_.endpoints) endpoints_.push_back(parseEndpoint(e, "EtcdStore"));
    if (options_.prefix.empty() || options_.prefix.front() != '/') options_.prefix = "/" + options_.prefix;
    if (options_.token.empty() && options_.tokenFromEnvironment) {
      if (const char* t = std::getenv(kStoreTokenEnv)) options_.token = t;
    }
    kvPrefix_ = options_.prefix + "/kv/";
    joinRun();
    keepAlive_ = std::thread([this] { keepAliveLoop(); });
  }

  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(stopMutex_);
      stopping_ = true;
    }
    stopWake_.notify_all();
    if (keepAlive_.joinable()) keepAlive_.join();
  }

  std::string describe() const { return formatEtcdUrl(options_); }
  int64_t leaseId() const { return lease_; }

  void set(const std::string& key, const Bytes& value) {
    call("/v3/kv/put", putRequest(kvPrefix_ + key, toString(value)), "set", key, /*idempotent=*/true);
  }

  Bytes get(const std::string& key, Clock::time_point deadline, std::chrono::milliseconds timeout) {
    return toBytes(waitFor(key, deadline, timeout, {key}));
  }

  int64_t add(const std::string& key, int64_t delta) {
    const std::string full = kvPrefix_ + key;
    const auto deadline = Clock::now() + timeout();
    json current = call("/v3/kv/range", {{"key", base64Encode(full)}}, "add", key, true);
    // add(key, 0) reads (pollers do): no write, and safe to send twice.
    if (delta == 0) {
      if (!current.contains("kvs") || current["kvs"].empty()) return 0;
      return parseCounter(key, toBytes(bytesField(current["kvs"][0], "value")));
    }
    while (true) {
      json compare;
      int64_t value = 0;
      if (current.contains("kvs") && !current["kvs"].empty()) {
        const json& kv = current["kvs"][0];
        value = parseCounter(key, toBytes(bytesField(kv, "value")));
        compare = {{"key", base64Encode(full)}, {"target", "MOD"}, {"result", "EQUAL"},
                   {"mod_revision", std::to_string(number(kv, "mod_revision"))}};
      } else {
        compare = {{"key", base64Encode(full)}, {"target", "VERSION"}, {"result", "EQUAL"}, {"version", "0"}};
      }
      const int64_t next = value + delta;
      json txn = {{"compare", json::array({compare})},
                  {"success", json::array({{{"request_put", putRequest(full, std::to_string(next))}}})},
                  {"failure", json::array({{{"request_range", {{"key", base64Encode(full)}}}}})}};
      // Not resent on a lost reply: the add may have happened.
      const json reply = call("/v3/kv/txn", txn, "add", key, /*idempotent=*/false);
      if (reply.value("succeeded", false)) return next;
      if (Clock::now() > deadline) {
        fail<StoreTimeout>("store {}: add('{}') lost its compare-and-set {} ms long to other writers", describe(),
                           key, timeout().count());
      }
      current = reply["responses"][0]["response_range"];
    }
  }

  bool check(const std::vector<std::string>& keys) {
    if (keys.empty()) return true;
    // One read transaction per 128 keys (etcd's --max-txn-ops by default).
    for (size_t first = 0; first < keys.size(); first += 128) {
      json ranges = json::array();
      for (size_t i = first; i < std::min(keys.size(), first + 128); ++i) {
        ranges.push_back({{"request_range", {{"key", base64Encode(kvPrefix_ + keys[i])}, {"count_only", true}}}});
      }
      const json reply = call("/v3/kv/txn", {{"success", ranges}}, "check", keys[first], true);
      for (const auto& r : reply.value("responses", json::array())) {
        if (number(r["response_range"], "count") == 0) return false;
      }
    }
    return true;
  }

  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    for (const auto& k : keys) waitFor(k, deadline, timeout, keys);
  }

  void setTimeout(std::chrono::milliseconds t) { timeoutMs_ = t.count(); }

 private:
  std::chrono::milliseconds timeout() const { return std::chrono::milliseconds(timeoutMs_.load()); }

  json putRequest(const std::string& full, const std::string& value) const {
    json put = {{"key", base64Encode(full)}, {"value", base64Encode(value)}};
    if (lease_ != 0) put["lease"] = std::to_string(lease_);
    return put;
  }

  // A connection from the pool, or a new one to the first endpoint that
  // answers (starting with the one that answered last).
  // A pooled connection that etcd closed (or that holds stray bytes) is
  // dropped, never used: a request sent on it might be lost unseen.
  std::unique_ptr<HttpConnection> take(Clock::time_point callerDeadline) {
    while (true) {
      std::unique_ptr<HttpConnection> c;
      {
        std::lock_guard<std::mutex> lock(poolMutex_);
        if (idle_.empty()) break;
        c = std::move(idle_.back());
        idle_.pop_back();
      }
      if (c->idleAndOpen()) return c;
    }
    return connect(callerDeadline);
  }

  void dropPool() {
    std::lock_guard<std::mutex> lock(poolMutex_);
    idle_.clear();
  }

  std::unique_ptr<HttpConnection> connect(Clock::time_point callerDeadline) {
    const auto deadline = std::min(callerDeadline, Clock::now() + options_.connectTimeout);
    const auto start = Clock::now();
    std::string errors;
    int attempt = 0;
    while (true) {
      const size_t first = current_.load();
      for (size_t i = 0; i < endpoints_.size(); ++i) {
        const size_t at = (first + i) % endpoints_.size();
        const EtcdEndpoint& e = endpoints_[at];
        try {
          auto c = std::make_unique<HttpConnection>(e.host, e.port,
                                                    std::min(deadline, Clock::now() + std::chrono::seconds(5)));
          current_ = at;
          return c;
        } catch (const ConnectionLost& lost) {
          errors = fmt::format("{}: {}", e.text, lost.reason);
        }
      }
      if (Clock::now() >= deadline) {
        fail<StoreError>("store {}: cannot reach etcd after {} ms (last: {}). HINT: is etcd running there? "
                         "(etcdctl --endpoints {} endpoint health)",
                         describe(),
                         std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count(),
                         errors, fmt::join(options_.endpoints, ","));
      }
      // 50 ms, doubling to 1 s, while etcd starts or an endpoint comes back.
      const auto pause = std::chrono::milliseconds(std::min(1000, 50 << std::min(attempt++, 5)));
      std::this_thread::sleep_for(std::min<Clock::duration>(pause, std::max<Clock::duration>(
                                                                       deadline - Clock::now(), Clock::duration(0))));
    }
  }

  void giveBack(std::unique_ptr<HttpConnection> c) {
    if (!c->reusable()) return;
    std::lock_guard<std::mutex> lock(poolMutex_);
    if (idle_.size() < 8) idle_.push_back(std::move(c));
  }

  [[noreturn]] void failReply(const std::string& op, const std::string& key, const std::string& endpoint,
                              int status, const std::string& body) {
    std::string message = body;
    try {
      const json error = json::parse(body);
      message = error.value("message", error.value("error", body));
    } catch (const json::exception&) {
    }
    if (message.find("request is too large") != std::string::npos ||
        message.find("larger than max") != std::string::npos) {
      fail<StoreError>("store {}: {}('{}'): etcd at {} refused the request: {}. HINT: start etcd with a larger "
                       "--max-request-bytes (1.5 MiB by default; values travel in base64, 4/3 of their size)",
                       describe(), op, key, endpoint, message);
    }
    if (message.find("requested lease not found") != std::string::npos) {
      fail<StoreError>("store {}: {}('{}'): the run's lease has expired, and etcd dropped the job's keys (no process "
                       "of the job kept it alive for {} s). HINT: start the job again with a new --rdzv-id",
                       describe(), op, key, options_.leaseTtl.count());
    }
    if (status == 200) {  // an error inside a stream
      fail<StoreError>("store {}: {}('{}'): etcd at {}: {}", describe(), op, key, endpoint, message);
    }
    fail<StoreError>("store {}: {}('{}'): etcd at {} answered HTTP {}: {}", describe(), op, key, endpoint, status,
                     message);
  }

  // One unary request, by `callerDeadline` (the store's timeout if none).
  // A request that may go twice (reads, writes of a value) moves to the
  // next endpoint when its connection breaks or its member stops
  // answering; one that may not (an add's compare-and-set) is never sent
  // again: it fails, saying so.
  json call(const std::string& path, const json& request, const std::string& op, const std::string& key,
            bool idempotent, std::optional<Clock::time_point> callerDeadline = std::nullopt) {
    const std::string body = request.dump();
    const auto deadline =
        callerDeadline ? *callerDeadline : Clock::now() + std::max(timeout(), std::chrono::milliseconds(1000));
    for (int tries = 0;; ++tries) {
      auto c = take(deadline);
      const std::string endpoint = c->endpoint();
      etcd::HttpReply reply;
      std::string broke;
      try {
        reply = c->post(path, body, deadline);
      } catch (const IoTimeout&) {
        broke = "no answer";
        if (!idempotent || Clock::now() >= deadline) {
          fail<StoreTimeout>("store {}: {}('{}'): etcd at {} did not answer in time ({} ms){}", describe(), op, key,
                             endpoint, timeout().count(),
                             idempotent ? "" : "; not sent again, since it may have been applied");
        }
      } catch (const ConnectionLost& lost) {
        broke = lost.reason;
      }
      if (!broke.empty()) {
        // That member may be gone: none of its connections is reused.
        dropPool();
        if (idempotent && tries < 2 * static_cast<int>(endpoints_.size()) + 2 && Clock::now() < deadline) {
          current_ = (current_.load() + 1) % endpoints_.size();
          continue;
        }
        fail<StoreError>("store {}: {}('{}'): lost the connection to etcd at {} ({}){}", describe(), op, key,
                         endpoint, broke, idempotent ? "" : "; not sent again, since it may have been applied");
      }
      if (reply.status != 200) failReply(op, key, endpoint, reply.status, reply.body);
      giveBack(std::move(c));
      try {
        return json::parse(reply.body);
      } catch (const json::exception& e) {
        fail<StoreError>("store {}: {}('{}'): etcd at {} sent JSON that does not parse: {}", describe(), op, key,
                         endpoint, e.what());
      }
    }
  }

  // The value of `key` once it exists: a range, then a watch from the
  // range's revision on, until the deadline.
  std::string waitFor(const std::string& key, Clock::time_point deadline, std::chrono::milliseconds timeout,
                      const std::vector<std::string>& waitedFor) {
    const std::string full = kvPrefix_ + key;
    while (true) {
      const json range = call("/v3/kv/range", {{"key", base64Encode(full)}}, "get", key, true,
                              std::max(deadline, Clock::now() + std::chrono::milliseconds(1000)));
      if (range.contains("kvs") && !range["kvs"].empty()) return bytesField(range["kvs"][0], "value");
      const int64_t revision = number(range["header"], "revision");
      if (Clock::now() >= deadline) fail<StoreTimeout>("{}", waitTimeoutMessage(describe(), waitedFor, timeout));
      // A watch of at most 10 s, then a range again: a member that went
      // dark without closing the connection cannot hold the wait.
      const auto window = std::min(deadline, Clock::now() + std::chrono::seconds(10));
      std::unique_ptr<HttpConnection> stream;
      try {
        stream = connect(window);
        const json create = {{"create_request",
                              {{"key", base64Encode(full)}, {"start_revision", std::to_string(revision + 1)}}}};
        const int status = stream->startStream("/v3/watch", create.dump(), window);
        std::string line;
        if (status != 200) {
          stream->nextLine(&line, window);
          failReply("wait", key, stream->endpoint(), status, line);
        }
        while (stream->nextLine(&line, window)) {
          if (line.empty()) continue;
          const json message = json::parse(line);
          if (message.contains("error")) failReply("wait", key, stream->endpoint(), 200, line);
          const json& result = message["result"];
          if (result.value("canceled", false)) {
            if (number(result, "compact_revision") != 0) break;  // compacted past our revision: range again
            failReply("wait", key, stream->endpoint(), 200,
                      json{{"message", "the watch was cancelled: " + result.value("cancel_reason", std::string("?"))}}
                          .dump());
          }
          for (const auto& event : result.value("events", json::array())) {
            if (event.value("type", std::string("PUT")) == "PUT") return bytesField(event["kv"], "value");
          }
        }
      } catch (const IoTimeout&) {
      } catch (const ConnectionLost&) {
        // The member went away: range again, on the next endpoint.
        current_ = (current_.load() + 1) % endpoints_.size();
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        continue;
      } catch (const json::exception& e) {
        fail<StoreError>("store {}: wait('{}'): a watch message does not parse: {}", describe(), key, e.what());
      }
      if (Clock::now() >= deadline) fail<StoreTimeout>("{}", waitTimeoutMessage(describe(), waitedFor, timeout));
    }
  }

  // The run: created by the first handle, joined by the others.
  void joinRun() {
    for (int attempt = 0;; ++attempt) {
      if (joinRunOnce() || attempt == 2) return;
    }
  }

  // False when the run found had just expired: look again.
  bool joinRunOnce() {
    const std::string runKey = options_.prefix + "/run";
    const std::string proof = hex(tcpstore::hmacSha256(options_.token, "ddp etcd run proof"));
    json range = call("/v3/kv/range", {{"key", base64Encode(runKey)}}, "join", runKey, true);
    if (!range.contains("kvs") || range["kvs"].empty()) {
      const json grant = call("/v3/lease/grant", {{"TTL", std::to_string(options_.leaseTtl.count())}}, "join",
                              runKey, true);
      const int64_t mine = number(grant, "ID");
      const json run = {{"lease", std::to_string(mine)}, {"proof", proof}};
      json put = {{"key", base64Encode(runKey)}, {"value", base64Encode(run.dump())}, {"lease", std::to_string(mine)}};
      const json txn = {
          {"compare",
           json::array({{{"key", base64Encode(runKey)}, {"target", "VERSION"}, {"result", "EQUAL"}, {"version", "0"}}})},
          {"success", json::array({{{"request_put", put}}})},
          {"failure", json::array({{{"request_range", {{"key", base64Encode(runKey)}}}}})}};
      const json reply = call("/v3/kv/txn", txn, "join", runKey, false);
      if (reply.value("succeeded", false)) {
        lease_ = mine;
        logInfo("store {}: started run {} (lease {:x}, TTL {} s)", describe(), runKey, lease_,
                options_.leaseTtl.count());
        return true;
      }
      range = reply["responses"][0]["response_range"];
      if (!range.contains("kvs") || range["kvs"].empty()) return false;  // gone again meanwhile
      // Ours is not the run (another handle created it first): give it back.
      const json found = json::parse(bytesField(range["kvs"][0], "value"), nullptr, false);
      if (found.is_object() && found.value("lease", std::string()) != std::to_string(mine)) {
        call("/v3/lease/revoke", {{"ID", std::to_string(mine)}}, "join", runKey, true);
      }
    }
    const json run = json::parse(bytesField(range["kvs"][0], "value"), nullptr, false);
    if (run.is_discarded() || !run.contains("proof") || !run.contains("lease")) {
      fail<StoreError>("store {}: {} holds something other than a ddp run. HINT: pick another --rdzv-id, or "
                       "remove it (etcdctl del --prefix {}/)",
                       describe(), runKey, options_.prefix);
    }
    if (!tcpstore::sameBytes(run["proof"].get<std::string>(), proof)) {
      fail<StoreError>("store {}: the job under {} was started with another store token. HINT: give every node "
                       "the same {} (or none), or a new --rdzv-id for a new job",
                       describe(), options_.prefix, kStoreTokenEnv);
    }
    lease_ = std::strtoll(run["lease"].get<std::string>().c_str(), nullptr, 10);
    // The run may have expired just now (a job of the same id that ended
    // a lease's TTL ago): then start a fresh one.
    const json alive = call("/v3/lease/keepalive", {{"ID", std::to_string(lease_)}}, "join", runKey, true);
    if (number(alive.value("result", json::object()), "TTL") <= 0) return false;
    logInfo("store {}: joined run {} (lease {:x})", describe(), runKey, lease_);
    return true;
  }

  void keepAliveLoop() {
    const auto every = std::max<std::chrono::milliseconds>(std::chrono::milliseconds(200), options_.leaseTtl / 3);
    bool warnedExpired = false, warnedFailed = false;
    std::unique_lock<std::mutex> lock(stopMutex_);
    while (!stopWake_.wait_for(lock, every, [this] { return stopping_; })) {
      lock.unlock();
      // Each try within one period, so the lease is renewed several times
      // a TTL, and the destructor waits at most one period for this thread.
      try {
        const json reply = call("/v3/lease/keepalive", {{"ID", std::to_string(lease_)}}, "keepalive", "", true,
                                Clock::now() + std::max<std::chrono::milliseconds>(every, std::chrono::seconds(1)));
        if (number(reply.value("result", json::object()), "TTL") <= 0 && !warnedExpired) {
          warnedExpired = true;
          logWarn("store {}: the run's lease {:x} has expired: etcd dropped the job's keys", describe(), lease_);
        }
      } catch (const std::exception& e) {
        if (!warnedFailed) logWarn("store {}: keeping the run's lease alive failed (tried again): {}", describe(), e.what());
        warnedFailed = true;
      }
      lock.lock();
    }
  }

  EtcdStoreOptions options_;
  std::vector<EtcdEndpoint> endpoints_;
  std::string kvPrefix_;
  int64_t lease_ = 0;
  std::atomic<size_t> current_{0};
  std::mutex poolMutex_;
  std::vector<std::unique_ptr<HttpConnection>> idle_;
  std::thread keepAlive_;
  std::mutex stopMutex_;
  std::condition_variable stopWake_;
  bool stopping_ = false;
  std::atomic<int64_t> timeoutMs_{Store::kDefaultTimeout.count()};
};

EtcdStore::EtcdStore(EtcdStoreOptions options) {
  const auto timeout = options.timeout;
  impl_ = std::make_unique<Impl>(std::move(options));
  setTimeout(timeout);
  impl_->setTimeout(timeout);
}

EtcdStore::~EtcdStore() = default;

void EtcdStore::set(const std::string& key, const Bytes& value) {
  impl_->setTimeout(timeout_);
  impl_->set(key, value);
}

Bytes EtcdStore::get(const std::string& key) {
  impl_->setTimeout(timeout_);
  return impl_->get(key, Clock::now() + timeout_, timeout_);
}

int64_t EtcdStore::add(const std::string& key, int64_t delta) {
  impl_->setTimeout(timeout_);
  return impl_->add(key, delta);
}

bool EtcdStore::check(const std::vector<std::string>& keys) { return impl_->check(keys); }

void EtcdStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  impl_->wait(keys, effectiveTimeout(timeout));
}

std::string EtcdStore::describe() const { return impl_->describe(); }

int64_t EtcdStore::leaseId() const { return impl_->leaseId(); }

}  // namespace ddp
