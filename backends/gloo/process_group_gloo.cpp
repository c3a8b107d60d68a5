// ProcessGroupGloo: construction (rendezvous, transports, worker) and the
// dispatch of each public collective to its file under collectives/.
#include "backends/gloo/process_group_gloo.hpp"

#include <fmt/format.h>
#include <gloo/transport/device.h>

#include <cstdlib>

#include "backends/gloo/collectives/collectives.hpp"
#include "backends/gloo/hierarchical_group.hpp"
#include "backends/gloo/impl.hpp"
#include "backends/gloo/interface.hpp"
#include "backends/gloo/shm_channel.hpp"
#include "framework/core/errors.hpp"
#include "framework/core/help_links.hpp"
#include "framework/core/log.hpp"
#include "framework/store/prefix_store.hpp"

namespace ddp {
namespace {

// DDP_GLOO_SHM: unset or empty, "0" or "1"; throws UsageError otherwise.
// Returns whether it turns shared memory off.
bool shmVariableForbids() {
  const char* env = std::getenv("DDP_GLOO_SHM");
  if (env && *env && std::string(env) != "0" && std::string(env) != "1") {
    fail<UsageError>("DDP_GLOO_SHM=\"{}\": expected 0 (TCP only) or 1 (shared memory)", env);
  }
  return env && std::string(env) == "0";
}

}  // namespace

ProcessGroupGloo::ProcessGroupGloo(std::shared_ptr<Store> store, int rank, int size, ProcessGroupOptions options)
    : ProcessGroup(rank, size, std::move(options)), impl_(std::make_unique<Impl>(rank, size)) {
  // The tuning variables, checked here on every rank before any store
  // traffic: a mistake fails alike everywhere, not as a peer that vanished.
  gloo_backend::ringChunkBytes();
  Impl::inlineMaxBytes();
  const std::chrono::microseconds callerSpin = Impl::callerSpin(size);
  ShmChannel::checkSlotBytesVariable();
  const bool shmForbidden = shmVariableForbids();

  std::shared_ptr<::gloo::transport::Device> device = gloo_backend::openTcpDevice(options_, rank);
  impl_->listenAddress = device->str();

  // Gloo's device only chooses the interface and its address; the
  // collectives run over connections of our own (frames, ring) or shared
  // memory, so Gloo's full mesh of pairs is not connected.
  impl_->store = std::make_shared<PrefixStore>("gloo", store);

  if (size_ > 1) {
    const bool wantShm = options_.sharedMemory && !shmForbidden;
    std::unique_ptr<ShmChannel> channel;
    try {
      channel = ShmChannel::connect(*impl_->store, rank, size, wantShm, options_.timeout, &impl_->shmWhyNot);
    } catch (const std::exception& e) {
      fail<CollectiveError>(
          "[rank {}/{}] gloo: shared-memory setup through {} did not complete: {}. HINT: a peer rank may have died "
          "during start-up; {}",
          rank, size, store->describe(), e.what(), kRendezvousHelp);
    }
    if (channel) {
      impl_->shm = std::make_unique<gloo_backend::ShmCollectives>(std::move(channel), rank, size);
      impl_->shmCallerSpin = callerSpin;
    } else {
      // The frames and the ring run over connections of their own.
      const std::string ip = gloo_backend::listenIp(impl_->listenAddress);
      std::unique_ptr<Links> frameLinks, ringLinks;
      try {
        frameLinks = std::make_unique<Links>(*impl_->store, "frames", gloo_backend::FrameExchange::shapeFor(size),
                                             rank, size, ip, options_.timeout);
        ringLinks = std::make_unique<Links>(*impl_->store, "ring", Links::Shape::Ring, rank, size, ip,
                                            options_.timeout);
      } catch (const std::exception& e) {
        fail<CollectiveError>(
            "[rank {}/{}] gloo: connecting the TCP collectives' links through {} did not complete: {}. HINT: a "
            "peer rank may have died during start-up; {}",
            rank, size, store->describe(), e.what(), kRendezvousHelp);
      }
      impl_->frames = std::make_unique<gloo_backend::FrameExchange>(std::move(frameLinks));
      impl_->ring = std::make_unique<gloo_backend::Ring>(std::move(ringLinks));
    }
  }
  if (size_ > 1) {
    impl_->p2p = std::make_unique<PointToPoint>(impl_->store, rank, size,
                                                gloo_backend::listenIp(impl_->listenAddress),
                                                fmt::format("[rank {}/{}] gloo", rank, size));
    // A failed send or recv breaks the group, as a failed collective does:
    // after a timeout only this rank's (the peers time out by themselves,
    // as after a collective's timeout); else the peers learn it at once.
    Impl* impl = impl_.get();
    impl_->p2p->setFailureHook([impl](const std::string& why, bool timedOut) {
      if (impl->closing.load()) return;
      if (timedOut) {
        impl->markBroken(why);
      } else {
        impl->abort(why);
      }
    });
  }
  if (size_ == 1) {
    logInfo("[rank 0/1] gloo: group created; a single rank, nothing to communicate");
  } else if (impl_->shm) {
    logInfo("[rank {}/{}] gloo: group created; payloads move through shared memory (every rank on this host)",
            rank, size);
  } else {
    logInfo("[rank {}/{}] gloo: group created; payloads move over TCP, since {}", rank, size,
            impl_->shmWhyNot.empty() ? "shared memory is unavailable" : impl_->shmWhyNot);
  }
  impl_->startWorker();
}

ProcessGroupGloo::~ProcessGroupGloo() {
  // send/recv first: they have nothing to agree on with the peers, and a
  // peer's recv waiting on this rank then fails at once, as after a crash.
  impl_->closing = true;
  if (impl_->p2p) impl_->p2p->shutdown();
}

std::string ProcessGroupGloo::describeEndpoint() const {
  return gloo_backend::describeListenAddress(impl_->listenAddress, options_.masterAddr);
}

const std::string& ProcessGroupGloo::listenAddress() const { return impl_->listenAddress; }
bool ProcessGroupGloo::usesSharedMemory() const { return impl_->shm != nullptr; }
void ProcessGroupGloo::abort(const std::string& reason) { impl_->abort(reason); }
const std::string& ProcessGroupGloo::sharedMemoryUnavailableReason() const { return impl_->shmWhyNot; }

at::Tensor ProcessGroupGloo::allocateCommunicationBuffer(int64_t numel, const at::TensorOptions& options) {
  if (impl_->shm && numel > 0 && options.device().is_cpu() &&
      gloo_backend::reduceFnFor(c10::typeMetaToScalarType(options.dtype()))) {
    at::Tensor shared = impl_->shm->allocateBuffer(*impl_->store, numel, options, options_.timeout);
    if (shared.defined()) return shared;  // else every rank falls back
  }
  return ProcessGroup::allocateCommunicationBuffer(numel, options);
}

// ---- dispatch: one line per collective -------------------------------------------
namespace gc = gloo_backend::collectives;

WorkPtr ProcessGroupGloo::allreduce(at::Tensor& tensor, const AllreduceOptions& opts) {
  return gc::allreduce(*impl_, tensor, opts.op, resolveTimeout(opts.timeout));
}
WorkPtr ProcessGroupGloo::broadcast(at::Tensor& tensor, const BroadcastOptions& opts) {
  return gc::broadcast(*impl_, tensor, opts.root, resolveTimeout(opts.timeout));
}
WorkPtr ProcessGroupGloo::allgather(const at::Tensor& input, at::Tensor& output, const AllgatherOptions& opts) {
  return gc::allgather(*impl_, input, output, resolveTimeout(opts.timeout));
}
WorkPtr ProcessGroupGloo::reduceScatter(const at::Tensor& input, at::Tensor& output,
                                        const ReduceScatterOptions& opts) {
  return gc::reduceScatter(*impl_, input, output, opts.op, resolveTimeout(opts.timeout));
}
WorkPtr ProcessGroupGloo::barrier(const BarrierOptions& opts) {
  return gc::barrier(*impl_, resolveTimeout(opts.timeout));
}

namespace {

// DDP_GLOO_HIERARCHICAL: unset or empty, "0" or "1"; throws UsageError otherwise.
bool hierarchicalVariableForbids() {
  const char* env = std::getenv("DDP_GLOO_HIERARCHICAL");
  if (env && *env && std::string(env) != "0" && std::string(env) != "1") {
    fail<UsageError>("DDP_GLOO_HIERARCHICAL=\"{}\": expected 0 (one flat group) or 1 (by host, the default)", env);
  }
  return env && std::string(env) == "0";
}

}  // namespace

ProcessGroupPtr createGlooGroup(std::shared_ptr<Store> store, int rank, int size, const ProcessGroupOptions& options) {
  const bool forbidden = hierarchicalVariableForbids() | shmVariableForbids() | !options.sharedMemory;
  if (size > 2) {
    // Every rank takes part, also one that wants a flat group, so that all
    // decide alike even when the variables differ between nodes.
    auto topology = std::make_shared<PrefixStore>("gloo_topology", store);
    std::optional<gloo_backend::HostLayout> found =
        gloo_backend::discoverHostLayout(*topology, rank, size, options.hostId, forbidden, options.timeout);
    if (found && found->hosts() >= 2 && found->largestHost() >= 2) {
      gloo_backend::HostLayout layout = std::move(*found);
      const int host = layout.hostOf[static_cast<size_t>(rank)];
      const int index = layout.indexOf[static_cast<size_t>(rank)];
      const int hostRanks = static_cast<int>(layout.ranksOn[static_cast<size_t>(host)].size());
      auto local = std::make_shared<ProcessGroupGloo>(
          std::make_shared<PrefixStore>(fmt::format("gloo_host_{}", host), store), index, hostRanks, options);
      std::shared_ptr<ProcessGroupGloo> leaders;
      if (index == 0) {
        ProcessGroupOptions tcp = options;
        tcp.sharedMemory = false;  // one rank per host: they meet over the network
        leaders = std::make_shared<ProcessGroupGloo>(std::make_shared<PrefixStore>("gloo_leaders", store), host,
                                                     layout.hosts(), tcp);
      }
      logInfo("[rank {}/{}] gloo: {} hosts, up to {} ranks each: shared memory within a host, TCP among the hosts' "
              "leaders (this rank is {} of its host)",
              rank, size, layout.hosts(), layout.largestHost(), index);
      auto p2p = std::make_unique<PointToPoint>(std::make_shared<PrefixStore>("gloo_p2p", store), rank, size,
                                                gloo_backend::listenIp(local->listenAddress()),
                                                fmt::format("[rank {}/{}] gloo", rank, size));
      return std::make_shared<gloo_backend::HierarchicalGroup>(rank, size, options, std::move(layout),
                                                               std::move(local), std::move(leaders), std::move(p2p));
    }
  }
  return std::make_shared<ProcessGroupGloo>(std::move(store), rank, size, options);
}

void registerGlooBackend(BackendRegistry& registry) { registry.add("gloo", createGlooGroup); }

WorkPtr ProcessGroupGloo::gather(const at::Tensor& input, at::Tensor& output, const GatherOptions& opts) {
  return gloo_backend::collectives::gather(*impl_, input, output, opts.root, resolveTimeout(opts.timeout));
}

WorkPtr ProcessGroupGloo::scatter(const at::Tensor& input, at::Tensor& output, const ScatterOptions& opts) {
  return gloo_backend::collectives::scatter(*impl_, input, output, opts.root, resolveTimeout(opts.timeout));
}

WorkPtr ProcessGroupGloo::alltoall(const at::Tensor& input, at::Tensor& output, const std::vector<int64_t>& inputSplits,
                                   const std::vector<int64_t>& outputSplits, const AlltoallOptions& opts) {
  return gloo_backend::collectives::alltoall(*impl_, input, output, inputSplits, outputSplits,
                                             resolveTimeout(opts.timeout));
}

WorkPtr ProcessGroupGloo::send(const at::Tensor& tensor, int dst, const SendOptions& opts) {
  if (!impl_->p2p) fail<UsageError>("[rank 0/1] gloo send: a group of one rank has no one to send to");
  if (opts.tag < 0) fail<UsageError>("[rank {}/{}] gloo send: tag {} is negative (negative tags are internal)", rank_, size_, opts.tag);
  if (std::exception_ptr broken = impl_->failure()) {
    return Work::failedEarlier(fmt::format("[rank {}/{}] gloo send to rank {}", rank_, size_, dst), broken);
  }
  return impl_->p2p->send(tensor, dst, opts.tag, resolveTimeout(opts.timeout));
}

WorkPtr ProcessGroupGloo::recv(at::Tensor& tensor, int src, const RecvOptions& opts) {
  if (!impl_->p2p) fail<UsageError>("[rank 0/1] gloo recv: a group of one rank has no one to receive from");
  if (opts.tag < 0) fail<UsageError>("[rank {}/{}] gloo recv: tag {} is negative (negative tags are internal)", rank_, size_, opts.tag);
  if (std::exception_ptr broken = impl_->failure()) {
    return Work::failedEarlier(fmt::format("[rank {}/{}] gloo recv from rank {}", rank_, size_, src), broken);
  }
  return impl_->p2p->recv(tensor, src, opts.tag, resolveTimeout(opts.timeout));
}

}  // namespace ddp
