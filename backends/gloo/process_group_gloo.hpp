// ProcessGroupGloo: the ProcessGroup contract (framework/comm/process_group.hpp)
// for CPU tensors, between hosts over TCP, within one through shared memory.
//
// - Ranks meet through our Store. Gloo's TCP device chooses the address:
//   the interface that reaches MASTER_ADDR
//   (ProcessGroupOptions::masterAddr), or GLOO_SOCKET_IFNAME /
//   ProcessGroupOptions::interface when set (interface.hpp). The
//   collectives run over connections of our own on that address
//   (framework/comm/links.hpp) or through shared memory; Gloo's pairs are
//   not connected.
// - One worker thread runs the collectives in call order; callers get a
//   Work at once. Non-contiguous or non-CPU tensors are staged through a
//   contiguous host copy.
// - Every TCP collective starts with a frame from each rank to each other
//   rank (frames.hpp) that carries a descriptor (sequence number,
//   operation, dtype, element count, root, reduce op); ranks that disagree
//   fail with a CollectiveError before any payload moves, and close their
//   connections, so that the others fail at once too. (Above 8 ranks frames
//   go to the right neighbour only: the ranks next to a disagreeing one
//   fail at once, others at the latest at their next collective.) Payloads
//   up to 64 KiB (less above 3 ranks: FrameExchange::fits) travel inside
//   the frame, which is only as long as its payload, so a small collective
//   is one network hop, reduced locally in rank order (the same bits on
//   every rank), and runs in the caller when nothing is queued (impl.hpp).
// - Larger payloads go around a ring of our own TCP connections, one to
//   each neighbour (ring.hpp, framework/comm/links.hpp), pipelined in chunks:
//   allreduce and reduce_scatter as reduce-scatter (then allgather),
//   allgather once around, broadcast as a chain from the root.
// - Small collectives (shared memory, or a payload that fits a frame) run
//   in the calling thread when nothing is queued (impl.hpp), and so wait
//   for the peers there: ranks must call the collectives of two groups in
//   the same order, and a Work callback must not wait() on a collective of
//   the same group. DDP_GLOO_INLINE_BYTES=0 keeps every collective on the
//   worker.
// - When all ranks share a host, every collective instead goes through a
//   shared-memory segment (shm_collectives.hpp, shm_channel.hpp), where the
//   descriptors are checked too. ProcessGroupOptions::sharedMemory or
//   DDP_GLOO_SHM=0 turn that off.
// - DDP_LOG_LEVEL=info logs the group (rank, size, shared memory or TCP and
//   why); debug also logs every collective as it is queued, with its path.
// The machinery lives behind Impl (impl.hpp); each collective in its own
// file under collectives/.
#pragma once

#include <memory>
#include <string>

#include "framework/comm/backend_registry.hpp"
#include "framework/comm/process_group.hpp"
#include "framework/store/store.hpp"

namespace ddp {

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
  // gather, scatter and alltoall move one block per pair of ranks, straight
  // from input to output (collectives/blocks.hpp): through shared memory,
  // behind the frames over their mesh, or (above 8 TCP ranks) point to
  // point. reduce is the default: an allreduce.
  WorkPtr gather(const at::Tensor& input, at::Tensor& output, const GatherOptions& opts = {}) override;
  WorkPtr scatter(const at::Tensor& input, at::Tensor& output, const ScatterOptions& opts = {}) override;
  WorkPtr alltoall(const at::Tensor& input, at::Tensor& output, const std::vector<int64_t>& inputSplits = {},
                   const std::vector<int64_t>& outputSplits = {}, const AlltoallOptions& opts = {}) override;
  // send/recv: over TCP connections of their own
  // (framework/comm/point_to_point.hpp), made between a sender and a
  // receiver on first use, also on one host. One that fails breaks the
  // group, as a failed collective does.
  WorkPtr send(const at::Tensor& tensor, int dst, const SendOptions& opts = {}) override;
  WorkPtr recv(at::Tensor& tensor, int src, const RecvOptions& opts = {}) override;
  // In shared memory when the group uses it, so that allreduce on the
  // buffer moves no data; a plain tensor otherwise.
  at::Tensor allocateCommunicationBuffer(int64_t numel, const at::TensorOptions& options) override;

  // Gloo's description of the transport's address, e.g. "tcp, pci=,
  // iface=lo, speed=-1, addr=[127.0.0.1]" (for tests of interface selection).
  const std::string& listenAddress() const;
  // Breaks the group at once (later collectives fail with `reason`) and,
  // through shared memory, tells the peers, so that a peer waiting for this
  // rank in a collective fails now rather than at its timeout. For a group
  // that uses this one as a step of its own collectives
  // (hierarchical_group.hpp), and for ProcessGroup::abort. Any thread.
  void abort(const std::string& reason) override;
  // Whether payloads move through shared memory; if not, why not.
  bool usesSharedMemory() const;
  const std::string& sharedMemoryUnavailableReason() const;

  struct Impl;  // queue, worker thread, transports; impl.hpp

 private:
  std::unique_ptr<Impl> impl_;
};

// The "gloo" backend's factory: a ProcessGroupGloo, or, when the ranks
// span several hosts and some host has several, a HierarchicalGroup
// (hierarchical_group.hpp) of ProcessGroupGloos: one per host (shared
// memory) and one among the hosts' leaders (TCP). DDP_GLOO_HIERARCHICAL=0
// or no shared memory keeps one flat group.
ProcessGroupPtr createGlooGroup(std::shared_ptr<Store> store, int rank, int size, const ProcessGroupOptions& options);
void registerGlooBackend(BackendRegistry& registry);

}  // namespace ddp
