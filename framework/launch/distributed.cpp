#include "framework/launch/distributed.hpp"

#include <iostream>

#include "framework/comm/backend_registry.hpp"
#include "framework/store/hash_store.hpp"
#include "framework/comm/single_process_group.hpp"
#include "framework/store/tcp_store.hpp"

namespace ddp {

DistributedContext initDistributed(const RankEnv& env, const DistributedOptions& options,
                                   const BackendRegistry& backends) {
  DistributedContext ctx;
  ctx.env = env;
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
  // Which address the peers reach this rank on: a multi-homed node that
  // picked the wrong interface shows it here (docs/clusters.md).
  if (env.worldSize > 1) {
    const std::string endpoint = ctx.group->describeEndpoint();
    // One write, so that lines of ranks sharing a terminal stay whole.
    if (!endpoint.empty()) {
      std::cerr << ctx.group->backendName() + ": rank " + std::to_string(env.rank) + " " + endpoint + "\n" << std::flush;
    }
  }
  return ctx;
}

}  // namespace ddp
