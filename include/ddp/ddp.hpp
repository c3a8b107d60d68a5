// ddp: distributed data-parallel training on LibTorch. The one header a
// program includes: #include <ddp/ddp.hpp>, and link ddp::ddp (CMake:
// find_package(ddp), or add_subdirectory() of ddp's source tree).
//
// What it declares, and where each piece lives (include that header alone
// when you need only that piece, and link the matching target):
// - Collectives (ddp::comm): Store, HashStore, FileStore, TCPStore
//   (framework/store/), ProcessGroup with allreduce, broadcast, allgather,
//   reduceScatter, barrier (framework/comm/process_group.hpp), the
//   BackendRegistry that creates a group by backend name
//   (framework/comm/backend_registry.hpp) and builtinBackends(), the
//   registry of the backends this build compiled: gloo, nccl
//   (backends/builtin.hpp).
// - Start-up (ddp::comm): RankEnv read from the environment (torchrun,
//   SLURM, MPI, ddp-run; framework/launch/rank_env.hpp) and
//   initDistributed(), which builds the store and the process group for one
//   rank (framework/launch/distributed.hpp).
// - Training (ddp::train): DistributedDataParallel, which averages
//   gradients over a ProcessGroup (framework/parallel/ddp.hpp),
//   DistributedSampler (framework/parallel/sampler.hpp), the
//   PluginRegistry of datasets, models, optimizers, schedulers and losses
//   (framework/experiment/plugin_registry.hpp), experiment configs
//   (framework/experiment/experiment_config.hpp) and runTraining(), the
//   trainer behind ddp-run (framework/experiment/trainer.hpp).
// - Built-in plugins (ddp::plugins): builtinPlugins(), a PluginRegistry
//   holding the plugins that ship with ddp (plugins/builtin.hpp).
// - Build facts: ddp/config.hpp (DDP_HAVE_GLOO, DDP_HAVE_NCCL, DDP_VERSION).
//
// An out-of-tree plugin library does not include this header's libraries:
// it includes framework/experiment/plugin_registry.hpp, compiles against
// ddp::headers and exports ddp_register_plugins (plugins/example/).
#pragma once

#include "ddp/config.hpp"

#include "framework/core/errors.hpp"
#include "framework/store/store.hpp"
#include "framework/store/hash_store.hpp"
#include "framework/store/file_store.hpp"
#include "framework/store/prefix_store.hpp"
#include "framework/store/tcp_store.hpp"
#include "framework/comm/process_group.hpp"
#include "framework/comm/backend_registry.hpp"
#include "backends/builtin.hpp"
#include "framework/launch/rank_env.hpp"
#include "framework/launch/distributed.hpp"
#include "framework/parallel/ddp.hpp"
#include "framework/parallel/sampler.hpp"
#include "framework/experiment/plugin_registry.hpp"
#include "framework/experiment/experiment_config.hpp"
#include "framework/experiment/trainer.hpp"
#include "plugins/builtin.hpp"
