#include "framework/launch/distributed.hpp"

#include <fmt/format.h>

#include <chrono>
#include <iostream>

#include "framework/comm/backend_registry.hpp"
#include "framework/store/hash_store.hpp"
#include "framework/comm/single_process_group.hpp"
#include "framework/core/log.hpp"
#include "framework/store/tcp_store.hpp"

namespace ddp {

DistributedContext initDistributed(const RankEnv& env, const DistributedOptions& options,
                                   const BackendRegistry& backends) {
  DistributedContext ctx;
  ctx.env = env;
  setLogRank(env.rank);
  const auto start = std::chrono::steady_clock::now();
  if (env.worldSize == 1) {
    ctx.store = std::make_shared<HashStore>();
  } else {
    TCPStoreOptions so;
    so.host = env.masterAddr;
    so.port = static_cast<uint16_t>(env.masterPort);
    so.isServer = env.rank == 0;
    so.connectTimeout = options.connectTimeout;
    so.timeout = options.timeout;
    ctx.store = std::make_shared<TCPStore>(so);
  }
  ctx.store->setTimeout(options.timeout);
  ProcessGroupOptions po;
  po.timeout = options.timeout;
  po.masterAddr = env.masterAddr;
  po.deviceIndex = env.localRank;  // GPU backends: rank -> cuda:LOCAL_RANK
  if (env.worldSize == 1 && backends.compiledOut(options.backend)) {
    // One rank needs no communication: a build without this backend still
    // runs single-process experiments.
    ctx.group = std::make_shared<SingleProcessGroup>(po);
  } else {
    ctx.group = backends.create(options.backend, ctx.store, env.rank, env.worldSize, po);
  }
  logInfo("rendezvous: store {}, world size {}, backend {}: group ready after {:.3f} s", ctx.store->describe(),
          env.worldSize, ctx.group->backendName(),
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  // Which address the peers reach this rank on: a multi-homed node that
  // picked the wrong interface shows it here (docs/clusters.md).
  if (env.worldSize > 1) {
    const std::string endpoint = ctx.group->describeEndpoint();
    // One write, so that lines of ranks sharing a terminal stay whole.
    if (!endpoint.empty()) {
      std::cerr << fmt::format("{}: rank {} {}\n", ctx.group->backendName(), env.rank, endpoint) << std::flush;
    }
  }
  return ctx;
}

}  // namespace ddp
