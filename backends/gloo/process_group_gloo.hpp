// ProcessGroupGloo: the ProcessGroup contract (framework/comm/process_group.hpp)
// over the Gloo library's TCP transport, for CPU tensors.
//
// - Ranks meet through gloo::rendezvous over our Store, then hold one TCP
//   connection per peer. The transport binds to the interface that reaches
//   MASTER_ADDR (ProcessGroupOptions::masterAddr), or to GLOO_SOCKET_IFNAME
//   / ProcessGroupOptions::interface when set.
// - One worker thread runs the collectives in call order; callers get a
//   Work at once. Non-contiguous or non-CPU tensors are staged through a
//   contiguous host copy.
// - Every collective starts with a fixed-size frame from each rank to each
//   other rank (to the right neighbour only above kAllToAllMaxRanks ranks),
//   received into buffers posted two collectives ahead, so it costs one
//   network hop. The frame carries a descriptor (sequence number, operation,
//   dtype, element count, root, reduce op) that each rank checks against its
//   own: ranks that disagree fail with a CollectiveError before any payload
//   moves. Payloads up to kSmallPayloadBytes travel inside the frame, so a
//   small collective is that one hop, reduced locally in rank order (the
//   same bits on every rank).
// - Larger allreduce and reduce_scatter use our own pipelined ring over
//   Gloo's unbound buffers; larger broadcast and allgather use Gloo's.
// - When all ranks share a host, every collective instead goes through a
//   shared-memory segment (shm_channel.hpp); the descriptor check then
//   happens there. ProcessGroupOptions::sharedMemory or DDP_GLOO_SHM=0
//   turn that off.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "framework/comm/backend_registry.hpp"
#include "framework/comm/process_group.hpp"
#include "framework/store/store.hpp"

namespace gloo {
class Context;
namespace transport {
class UnboundBuffer;
}
}  // namespace gloo

namespace ddp {

class ShmBuffer;
class ShmChannel;

class ProcessGroupGloo : public ProcessGroup {
 public:
  ProcessGroupGloo(std::shared_ptr<Store> store, int rank, int size, ProcessGroupOptions options);
  ~ProcessGroupGloo() override;

  std::string backendName() const override { return "gloo"; }
  // "listens on 10.0.0.2 (interface eth0, the one that routes to MASTER_ADDR ...)".
  std::string describeEndpoint() const override;

  WorkPtr allreduce(at::Tensor& tensor, const AllreduceOptions& opts = {}) override;
  WorkPtr broadcast(at::Tensor& tensor, const BroadcastOptions& opts = {}) override;
  WorkPtr allgather(const at::Tensor& input, at::Tensor& output, const AllgatherOptions& opts = {}) override;
  WorkPtr reduceScatter(const at::Tensor& input, at::Tensor& output,
                        const ReduceScatterOptions& opts = {}) override;
  WorkPtr barrier(const BarrierOptions& opts = {}) override;
  at::Tensor allocateCommunicationBuffer(int64_t numel, const at::TensorOptions& options) override;

  // The address the transport listens on, e.g. "10.0.0.2" (for tests of
  // interface selection).
  const std::string& listenAddress() const { return listenAddress_; }
  // Whether payloads move through shared memory; if not, why not.
  bool usesSharedMemory() const { return shm_ != nullptr; }
  const std::string& sharedMemoryUnavailableReason() const { return shmWhyNot_; }

  // What one queued collective needs; public only for the .cpp's helpers.
  struct Descriptor {
    uint64_t seq = 0;
    uint32_t op = 0;  // OpCode
    uint32_t dtype = 0;
    int64_t numel = 0;
    int32_t root = 0;
    int32_t reduceOp = 0;
    uint32_t sharedBuffer = 0;  // allreduce in place in ShmBuffer id - 1; 0: none
    uint32_t reserved = 0;      // keeps the struct free of padding (it is memcmp'd)
  };

 private:
  using Deadline = std::chrono::steady_clock::time_point;
  struct Task {
    Descriptor descriptor;
    WorkPtr work;
    Deadline deadline;
    Milliseconds timeout;
    std::function<void(const Descriptor&, Deadline)> run;
  };

  WorkPtr enqueue(Descriptor descriptor, const std::string& summary, Milliseconds timeout,
                  std::function<void(const Descriptor&, Deadline)> run);
  void workerLoop();
  // Sends this collective's frame and checks the peers' frames; returns
  // their payload area, indexed by rank (null for this rank).
  std::vector<const uint8_t*> exchangeFrames(const Descriptor& mine, const void* payload, size_t payloadBytes,
                                             Deadline deadline);
  void postFrameReceives(uint64_t seq);
  // The ranks whose frames we receive: every other, or the left neighbour.
  std::vector<int> framePeersIn() const {
    return size_ <= kAllToAllMaxRanks ? framePeers_ : std::vector<int>{(rank_ + size_ - 1) % size_};
  }
  bool smallPath(size_t payloadBytes) const {
    return payloadBytes <= kSmallPayloadBytes && size_ <= kAllToAllMaxRanks;
  }
  void runTask(Task& task);
  // The shared-memory versions of the collectives (shm_ set).
  void shmBeginRound(const Descriptor& d, bool first);
  void shmCheckDescriptors(const Descriptor& mine);
  template <typename Fill, typename Consume>
  void shmRounds(const Descriptor& d, size_t count, size_t chunkElems, Deadline deadline, Fill&& fill,
                 Consume&& consume);
  void shmAllreduce(const Descriptor& d, at::Tensor& host, ReduceOp op, Deadline deadline);
  void shmAllreduceInPlace(const Descriptor& d, ShmBuffer& buffer, at::Tensor& tensor, ReduceOp op,
                           Deadline deadline);
  // The shared buffer that `t` is exactly, if any.
  std::shared_ptr<ShmBuffer> sharedBufferOf(const at::Tensor& t);
  void shmReduceScatter(const Descriptor& d, const at::Tensor& in, at::Tensor& out, ReduceOp op, Deadline deadline);
  void shmBroadcast(const Descriptor& d, at::Tensor& host, int root, Deadline deadline);
  void shmAllgather(const Descriptor& d, const at::Tensor& in, at::Tensor& out, Deadline deadline);
  void checkPeerDescriptor(const Descriptor& mine, const Descriptor& theirs, int from) const;
  void ringReduceScatter(uint8_t* data, size_t count, size_t elementSize, int reduceOp, int dtype,
                         uint64_t seq, Deadline deadline, bool thenAllgather);

  static constexpr size_t kSmallPayloadBytes = 16 * 1024;
  static constexpr int kAllToAllMaxRanks = 8;
  static constexpr size_t kFrameBytes = sizeof(Descriptor) + kSmallPayloadBytes;

  // Worker-thread state. The destructor drops the unbound buffers and the
  // context first, so no connection writes into freed memory.
  std::vector<uint8_t> scratch_;         // receive space for the ring
  std::vector<uint8_t> reduceScatterIn_;  // reused: a fresh 64 MiB buffer per call costs page faults
  std::vector<uint8_t> sendFrame_;
  std::vector<uint8_t> recvFrames_[2];   // [seq % 2]: one frame per rank
  std::unique_ptr<gloo::transport::UnboundBuffer> sendFrameBuffer_;
  // [seq % 2][peer]: one unbound buffer per peer, since Gloo reports only
  // the rank of the latest completed receive of a buffer.
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> recvFrameBuffers_[2];

  std::shared_ptr<gloo::Context> context_;
  std::shared_ptr<Store> store_;  // "gloo/"-prefixed; also used to close in step
  std::string listenAddress_;
  std::vector<int> framePeers_;  // ranks we send frames to and expect frames from
  std::unique_ptr<ShmChannel> shm_;
  std::string shmWhyNot_;
  std::mutex sharedBuffersMutex_;
  std::map<const void*, std::weak_ptr<ShmBuffer>> sharedBuffers_;  // by this rank's base address


  std::mutex mutex_;
  std::condition_variable queued_;
  std::deque<Task> queue_;
  std::atomic<int> queuedCount_{0};  // queue_.size(), for polling without the lock
  bool stopping_ = false;
  uint64_t nextSeq_ = 0;
  std::exception_ptr broken_;  // first failure; later collectives fail with it
  std::thread worker_;
};

void registerGlooBackend(BackendRegistry& registry);

// The local IP address whose route reaches `host` (no packet is sent).
std::string localAddressTowards(const std::string& host);

}  // namespace ddp
