// C10dBridge: one of our ProcessGroups seen as a c10d::ProcessGroup: the
// backend "ddp" of Python's torch.distributed (python/ddp_torch).
//
// Contract
// - create() takes what torch.distributed hands a registered backend: its
//   store (a c10d PrefixStore per group), the rank, the size and the
//   timeout. Our group rendezvouses through that store alone (C10dStore),
//   as our "gloo" backend: shared memory within a host, TCP across,
//   hierarchical when both. The network interface is the one that reaches
//   MASTER_ADDR, or else the host of the TCPStore under the PrefixStores
//   (init_method "tcp://HOST:PORT"); neither: loopback, one host.
// - Copies back run with the calling thread's thread-local state
//   (inference mode, grad mode). An input copied to the wire (widened,
//   conjugated or non-contiguous) is read when the call is made.
// - Destroying the group waits for its peers through the store (up to its
//   closing timeout); Python holds the GIL meanwhile.
// - The operations PyTorch's DDP, ZeroRedundancyOptimizer and common code
//   call: allreduce (SUM, AVG, PRODUCT, MIN, MAX) and allreduce_coalesced,
//   broadcast, allgather and _allgather_base, reduce_scatter and
//   _reduce_scatter_base, alltoall and alltoall_base (splits along dim 0),
//   gather, scatter, reduce, send, recv, recvAnysource, barrier and
//   monitoredBarrier. One tensor per rank in each list (c10d's lists of
//   one tensor per device are refused, naming the op).
// - Any dtype that moves: ours are float32, float64, float16, bfloat16,
//   int32 and int64; uint8, int8, int16 and bool travel widened to int32
//   (reductions wrap as in their own type; bool's SUM and MAX are "or",
//   MIN and PRODUCT "and"), complex as pairs of reals (reductions: SUM and
//   AVG). Non-contiguous tensors go through a contiguous copy. Results are
//   copied back when the operation completes, before wait() returns and
//   before the future completes.
// - Work: wait() blocks until the operation and its copy back are done
//   and raises our error (rank, operation, sequence number, count and
//   timeout) as c10::Error, a RuntimeError in Python. getFuture() is
//   completed with the output tensors when the operation completes (on
//   the thread that completes it), or with that error: DDP's gradient hook
//   chains on it while backward goes on.
// - What it lacks raises a RuntimeError that names it: a reduce op other
//   than the five, allgather_coalesced, a dtype that cannot move.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <string>

#include "framework/comm/process_group.hpp"

namespace ddp::python {

class C10dBridge : public c10d::ProcessGroup {
 public:
  // `backend`: our backend's name in the registry (builtinBackends()).
  static c10::intrusive_ptr<c10d::ProcessGroup> create(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                        int size, std::chrono::milliseconds timeout,
                                                        const std::string& backend = "gloo");

  explicit C10dBridge(ProcessGroupPtr group);

  const std::string getBackendName() const override { return "ddp"; }
  const ProcessGroupPtr& group() const { return group_; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts = c10d::BroadcastOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts = c10d::AllreduceCoalescedOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts = c10d::ReduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts = c10d::GatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts = c10d::ScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outputSplits, std::vector<int64_t>& inputSplits,
                                               const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts = c10d::BarrierOptions()) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks = false) override;
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return issued_.load(); }

 private:
  ProcessGroupPtr group_;
  std::atomic<uint64_t> issued_{0};  // operations started on this group
};

}  // namespace ddp::python
