#include "framework/distributed.hpp"

#include <cstdlib>
#include <iostream>

#include "ddp/config.hpp"
#include "framework/backend_registry.hpp"
#include "framework/hash_store.hpp"
#include "framework/single_process_group.hpp"
#include "framework/tcp_store.hpp"
#if DDP_HAVE_GLOO
#include "backends/gloo/process_group_gloo.hpp"
#endif

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
  if (env.worldSize == 1 && BackendRegistry::global().compiledOut(options.backend)) {
    // One rank needs no communication: a build without this backend still
    // runs single-process experiments.
    ctx.group = std::make_shared<SingleProcessGroup>(po);
  } else {
    ctx.group = BackendRegistry::global().create(options.backend, ctx.store, env.rank, env.worldSize, po);
  }
#if DDP_HAVE_GLOO
  // Which address the peers reach this rank on: a multi-homed node that
  // picked the wrong interface shows it here (docs/clusters.md).
  if (env.worldSize > 1) {
    if (auto* gloo = dynamic_cast<ProcessGroupGloo*>(ctx.group.get())) {
      // Gloo describes its device as "tcp, pci=, iface=eth0, speed=-1, addr=[10.0.0.2]".
      const std::string device = gloo->listenAddress();
      auto field = [&](const std::string& key, const std::string& end) {
        const size_t at = device.find(key);
        if (at == std::string::npos) return std::string();
        const size_t from = at + key.size();
        return device.substr(from, device.find(end, from) - from);
      };
      std::string addr = field("addr=[", "]"), iface = field("iface=", ",");
      if (addr.empty()) addr = device;
      const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
      const std::string why =
          ifname && *ifname ? "from GLOO_SOCKET_IFNAME" : "the one that routes to MASTER_ADDR " + env.masterAddr;
      // One write, so that lines of ranks sharing a terminal stay whole.
      std::cerr << "gloo: rank " + std::to_string(env.rank) + " listens on " + addr + " (interface " +
                       (iface.empty() ? "?" : iface) + ", " + why + ")\n"
                << std::flush;
    }
  }
#endif
  return ctx;
}

}  // namespace ddp
