// Distributed start-up for one rank: the TCPStore at MASTER_ADDR:MASTER_PORT
// (served by rank 0) and the process group of the chosen backend.
#pragma once

#include <memory>
#include <string>

#include "framework/process_group.hpp"
#include "framework/rank_env.hpp"
#include "framework/store.hpp"

namespace ddp {

struct DistributedOptions {
  std::string backend = "gloo";
  Milliseconds timeout{300000};       // collectives
  Milliseconds connectTimeout{60000};  // reaching the master
};

struct DistributedContext {
  RankEnv env;
  std::shared_ptr<Store> store;
  ProcessGroupPtr group;
};

// World size 1 with no master needed uses an in-memory store.
DistributedContext initDistributed(const RankEnv& env, const DistributedOptions& options);

}  // namespace ddp
