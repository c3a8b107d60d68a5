#include "framework/distributed.hpp"

#include "framework/backend_registry.hpp"
#include "framework/hash_store.hpp"
#include "framework/tcp_store.hpp"

namespace ddp {

DistributedContext initDistributed(const RankEnv& env, const DistributedOptions& options) {
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
  ctx.group = BackendRegistry::global().create(options.backend, ctx.store, env.rank, env.worldSize, po);
  return ctx;
}

}  // namespace ddp
