// HierarchicalGroup: the gloo backend's collectives across several hosts
// with several ranks each. Ranks of one host work through shared memory;
// one leader per host (its lowest rank) does the cross-host step over TCP;
// the leader then shares the result with its host.
//
// - allreduce: reduce on each host (shared memory), allreduce among the
//   leaders (TCP ring, or frames when small), broadcast on each host;
//   above 1 MiB pipelined over up to 4 chunks, so that the host steps
//   overlap the cross-host one. Per
//   direction, each host's link carries what one rank sends in a ring of H
//   hosts, not what the ranks of a flat ring send: at 2 hosts x 2 ranks,
//   N bytes instead of 1.5 N.
// - broadcast: to the root's leader, among the leaders, then on each host.
// - allgather: on each host, among the leaders (one block per host, padded
//   to the largest host), then on each host; the blocks are put back in
//   rank order.
// - reduce_scatter: reduce the whole input on each host (laid out by
//   host), reduce-scatter by host among the leaders, then each leader gives
//   its host its block.
// - barrier: host, leaders, host.
// - Avg sums at every level and divides once by the world size, so integer
//   Avg truncates as the contract says. Every rank ends with the same bits.
// - The steps of one collective run on this group's thread, one collective
//   after another in call order; a small one (<= 16 KiB: scalars, metrics,
//   barriers) runs in the caller when nothing is queued. A failed step fails
//   the collective with a CollectiveError naming the step and the global
//   ranks of its sub-group, breaks the group (process_group.hpp) and aborts
//   the sub-groups, so that the host's other ranks fail at once too.
// - Hosts can differ in rank count (a host with one rank has no shared
//   memory step). createGlooGroup() (process_group_gloo.hpp) chooses this
//   group when there are at least two hosts and one of them has two ranks,
//   shared memory is allowed, and DDP_GLOO_HIERARCHICAL is not 0.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backends/gloo/process_group_gloo.hpp"
#include "framework/comm/process_group.hpp"
#include "framework/comm/point_to_point.hpp"
#include "framework/store/store.hpp"

namespace ddp::gloo_backend {

// Which ranks share a host. Hosts are numbered by their lowest rank; within
// a host, ranks are in ascending order (index 0 leads).
struct HostLayout {
  std::vector<int> hostOf;     // per rank
  std::vector<int> indexOf;    // per rank: its place among its host's ranks
  std::vector<std::vector<int>> ranksOn;  // per host
  int hosts() const { return static_cast<int>(ranksOn.size()); }
  int largestHost() const;
  // Where rank r's n elements sit in a buffer laid out by host, each host's
  // block padded to largestHost() * n (allgather, reduce_scatter).
  int64_t byHostOffset(int r, int64_t n) const {
    return (int64_t(hostOf[static_cast<size_t>(r)]) * largestHost() + indexOf[static_cast<size_t>(r)]) * n;
  }
};

// Collective over `store`: every rank says which host it is on (`hostId`,
// or the detected identity when empty), or that it wants one flat group
// (`flat`). Returns the layout, or nullopt when any rank wants flat, so
// that every rank decides alike.
std::optional<HostLayout> discoverHostLayout(Store& store, int rank, int size, const std::string& hostId, bool flat,
                                             Milliseconds timeout);

class HierarchicalGroup : public ProcessGroup {
 public:
  // local: this host's ranks; leaders: one rank per host, null on ranks
  // that do not lead.
  HierarchicalGroup(int rank, int size, ProcessGroupOptions options, HostLayout layout,
                    std::shared_ptr<ProcessGroupGloo> local, std::shared_ptr<ProcessGroupGloo> leaders,
                    std::unique_ptr<PointToPoint> p2p);
  ~HierarchicalGroup() override;

  std::string backendName() const override { return "gloo"; }
  std::string describeEndpoint() const override;
  const HostLayout& layout() const;

  WorkPtr allreduce(at::Tensor& tensor, const AllreduceOptions& opts = {}) override;
  WorkPtr broadcast(at::Tensor& tensor, const BroadcastOptions& opts = {}) override;
  WorkPtr allgather(const at::Tensor& input, at::Tensor& output, const AllgatherOptions& opts = {}) override;
  WorkPtr reduceScatter(const at::Tensor& input, at::Tensor& output,
                        const ReduceScatterOptions& opts = {}) override;
  WorkPtr barrier(const BarrierOptions& opts = {}) override;
  // gather, scatter and alltoall: a block per pair of ranks, straight
  // between them over TCP (exchangeBlocks, point_to_point.hpp), in call
  // order with the other collectives; across hosts no leader relays them.
  // A receiver of an unexpected count fails naming the sender.
  WorkPtr gather(const at::Tensor& input, at::Tensor& output, const GatherOptions& opts = {}) override;
  WorkPtr scatter(const at::Tensor& input, at::Tensor& output, const ScatterOptions& opts = {}) override;
  WorkPtr alltoall(const at::Tensor& input, at::Tensor& output, const std::vector<int64_t>& inputSplits = {},
                   const std::vector<int64_t>& outputSplits = {}, const AlltoallOptions& opts = {}) override;
  // Directly between the two ranks, over TCP (point_to_point.hpp).
  WorkPtr send(const at::Tensor& tensor, int dst, const SendOptions& opts = {}) override;
  WorkPtr recv(at::Tensor& tensor, int src, const RecvOptions& opts = {}) override;
  // In shared memory among this host's ranks (collective among them).
  at::Tensor allocateCommunicationBuffer(int64_t numel, const at::TensorOptions& options) override;
  // Breaks this group and aborts its sub-groups (this host's, and the
  // leaders' where this rank leads), so that its peers fail too.
  void abort(const std::string& reason) override;

 private:
  // Queues a collective that sends sends[j] to rank j and fills recvs[i]
  // from rank i (flat host views; this rank's own pair is copied), then
  // runs `after` (a copy back into a non-contiguous output).
  // `tag`: nextBlockTag(), taken before any argument check, so that a
  // call refused on one rank still keeps the numbering alike everywhere.
  WorkPtr blocks(int tag, const std::string& what, size_t bytes, Milliseconds timeout, std::vector<at::Tensor> sends,
                 std::vector<at::Tensor> recvs, std::function<void()> after);
  // Internal tags are negative (users' are >= 0), one per block collective.
  int nextBlockTag() { return -1 - static_cast<int>(blockCalls_.fetch_add(1) % (uint64_t(1) << 30)); }

  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::unique_ptr<PointToPoint> p2p_;  // shut down before impl_'s worker stops (the destructor)
  std::atomic<uint64_t> blockCalls_{0};  // numbers the block collectives alike on every rank: their tags
};

}  // namespace ddp::gloo_backend
