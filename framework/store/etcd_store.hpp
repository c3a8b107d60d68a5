// EtcdStore: a Store kept in etcd (v3), so that the job's rendezvous
// outlives every training host (ddp-run --rdzv-backend etcd).
//
// Contract (in addition to store.hpp)
// - Speaks etcd's JSON gateway (POST /v3/kv/..., /v3/watch,
//   /v3/lease/...) on the client port: plain HTTP/1.1 over our sockets, no
//   gRPC or protobuf to build or link. Every etcd from 3.4 serves it.
// - A job's keys live under `prefix` ("/ddp/<rdzv-id>"): "<prefix>/run"
//   names the run (its lease and the token's proof), "<prefix>/kv/<key>"
//   holds the store's keys. Jobs with other prefixes never meet.
// - The first handle of a run creates "<prefix>/run" (one transaction:
//   the first wins) with a lease of `leaseTtl`; every handle of the run,
//   launcher or rank, keeps that lease alive from a thread of its own and
//   writes every key under it. When the last process of the job is gone,
//   etcd drops the run and all its keys `leaseTtl` later, so a new job
//   with the same id starts clean; until then it joins the old run (use a
//   new --rdzv-id).
// - The token: the run holds HMAC-SHA-256(token, label), never the token.
//   A handle with another token is refused at once, with a HINT.
// - Endpoints: one or more host:port of the same etcd cluster. A handle
//   connects to the first that answers, until `connectTimeout`; a request
//   that fails on one endpoint before it was sent goes to the next. One
//   whose reply was lost is not resent (an add might count twice): it
//   fails with StoreError naming the endpoint.
// - `wait` and `get` watch the keys (no polling): a key set while they
//   wait wakes them within one round trip.
// - etcd limits a request to 1.5 MiB unless started with
//   --max-request-bytes; a bigger value fails with StoreError and a HINT.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "framework/store/store.hpp"

namespace ddp {

struct EtcdStoreOptions {
  // "host:port" of etcd's client URLs ("[::1]:2379" for IPv6); at least one.
  std::vector<std::string> endpoints;
  // The job's key prefix, "/ddp/<rdzv-id>" as ddp-run makes it.
  std::string prefix = "/ddp/default";
  // The job's shared secret; empty means "read DDP_STORE_TOKEN".
  std::string token;
  bool tokenFromEnvironment = true;
  std::chrono::milliseconds connectTimeout{60000};
  std::chrono::milliseconds timeout{Store::kDefaultTimeout};
  // How long the run's keys outlive its last process.
  std::chrono::seconds leaseTtl{30};
};

// "etcd://HOST:PORT[,HOST:PORT...][/PREFIX]" (the form DDP_STORE_URL carries):
// endpoints and prefix into `options`. Throws UsageError naming what is wrong.
void parseEtcdUrl(const std::string& url, EtcdStoreOptions* options);
// The same URL, from options.
std::string formatEtcdUrl(const EtcdStoreOptions& options);

class EtcdStore : public Store {
 public:
  explicit EtcdStore(EtcdStoreOptions options);
  ~EtcdStore() override;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) override;
  std::string describe() const override;

  // The run's lease, as etcd numbers it.
  int64_t leaseId() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp
