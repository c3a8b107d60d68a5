// ProcessGroup: the collectives that a set of ranks performs together.
//
// Contract
// - Every rank of the group calls the same collectives in the same order
//   with tensors of the same dtype and element count (broadcast: the same
//   root). A rank that deviates gets a CollectiveError naming both sides,
//   never corrupted memory.
// - Calls return a Work at once; operations run in call order. Inputs must
//   stay alive and unmodified until the Work completes. Results are in
//   place (allreduce, broadcast) or in the output tensor given. A backend
//   may run a small collective in the caller and return it completed (gloo
//   does so through shared memory), so a rank must not rely on starting
//   two groups' collectives in different orders than its peers.
// - Each call takes a plain options struct. A zero timeout means the
//   group's default (ProcessGroupOptions::timeout). A collective that does
//   not finish within its timeout fails with CollectiveError; none hangs.
// - After a collective fails, the group is broken: later calls fail at once
//   with the first error, since peers may be mid-operation.
// - Dtypes: float32, float64, float16, bfloat16, int32, int64. ReduceOp::Avg
//   on integer tensors truncates toward zero.
// - A backend that lacks an operation inherits the default here, which
//   throws NotSupportedError naming the backend and the operation.
// - Groups of some ranks (c10d's new_group) and the 2-D rank mesh that
//   hybrid sharding uses come from GroupFactory (sub_groups.hpp): each is an
//   ordinary ProcessGroup of its own, under a store prefix of its own.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "framework/comm/work.hpp"

namespace ddp {

enum class ReduceOp { Sum, Avg, Min, Max, Product };
const char* reduceOpName(ReduceOp op);

using Milliseconds = std::chrono::milliseconds;
constexpr Milliseconds kUseGroupTimeout{0};

struct AllreduceOptions {
  ReduceOp op = ReduceOp::Sum;
  Milliseconds timeout = kUseGroupTimeout;
};

struct BroadcastOptions {
  int root = 0;
  Milliseconds timeout = kUseGroupTimeout;
};

struct AllgatherOptions {
  Milliseconds timeout = kUseGroupTimeout;
};

struct ReduceScatterOptions {
  ReduceOp op = ReduceOp::Sum;
  Milliseconds timeout = kUseGroupTimeout;
};

struct BarrierOptions {
  Milliseconds timeout = kUseGroupTimeout;
};

struct ReduceOptions {
  int root = 0;
  ReduceOp op = ReduceOp::Sum;
  Milliseconds timeout = kUseGroupTimeout;
};

struct GatherOptions {
  int root = 0;
  Milliseconds timeout = kUseGroupTimeout;
};

struct ScatterOptions {
  int root = 0;
  Milliseconds timeout = kUseGroupTimeout;
};

struct AlltoallOptions {
  Milliseconds timeout = kUseGroupTimeout;
};

struct SendOptions {
  int tag = 0;
  Milliseconds timeout = kUseGroupTimeout;
};

struct RecvOptions {
  int tag = 0;
  Milliseconds timeout = kUseGroupTimeout;
};

// recv's source for a message from any rank.
constexpr int kAnySourceRank = -1;

// Settings common to every backend, given when a group is created.
struct ProcessGroupOptions {
  Milliseconds timeout{300000};
  // Network interface for TCP-based backends; empty = the one that reaches
  // the master (or GLOO_SOCKET_IFNAME when set).
  std::string interface;
  // The address that peers should reach to decide the interface ("" = loopback).
  std::string masterAddr;
  // GPU backends: the device of this rank; -1 = LOCAL_RANK modulo the devices.
  int deviceIndex = -1;
  // CPU backends: when all ranks share a host, move payloads through shared
  // memory instead of loopback TCP. DDP_GLOO_SHM=0 also turns it off.
  bool sharedMemory = true;
  // CPU backends: which host this rank counts as when ranks are grouped by
  // host (gloo's hierarchical collectives); empty = detected (host name,
  // boot, namespaces). Tests give ranks of one machine different hosts.
  std::string hostId;
};

class ProcessGroup {
 public:
  ProcessGroup(int rank, int size, ProcessGroupOptions options);
  virtual ~ProcessGroup() = default;

  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  virtual std::string backendName() const = 0;
  // Where peers reach this rank, for start-up logs, e.g. "listens on
  // 10.0.0.2 (interface eth0, ...)"; "" when the backend has nothing to say.
  virtual std::string describeEndpoint() const { return ""; }
  const ProcessGroupOptions& options() const { return options_; }

  // In place: every rank ends with op(tensor of rank 0, ..., rank n-1).
  virtual WorkPtr allreduce(at::Tensor& tensor, const AllreduceOptions& opts = {});
  // In place: every rank ends with the root's tensor.
  virtual WorkPtr broadcast(at::Tensor& tensor, const BroadcastOptions& opts = {});
  // output has size() * input.numel() elements; slice r receives rank r's
  // input. In place: input may be this rank's slice of output.
  virtual WorkPtr allgather(const at::Tensor& input, at::Tensor& output, const AllgatherOptions& opts = {});
  // input has size() * output.numel() elements; rank r receives op over
  // ranks of slice r.
  virtual WorkPtr reduceScatter(const at::Tensor& input, at::Tensor& output,
                                const ReduceScatterOptions& opts = {});
  virtual WorkPtr barrier(const BarrierOptions& opts = {});

  // The rooted collectives and all-to-all. Every rank calls them with the
  // same root and element counts; the defaults below are built on the
  // collectives above (composed_collectives.cpp), so every backend has
  // them, at the cost each names; a backend may override one with an
  // algorithm of its own.
  // root's tensor ends with op over every rank's; the others' are left as
  // they were. Default: an allreduce (of a copy, off the root).
  virtual WorkPtr reduce(at::Tensor& tensor, const ReduceOptions& opts = {});
  // root's output (size() * input.numel() elements) receives rank r's
  // input in slice r; elsewhere output is not used (may be undefined).
  // Default: an allgather (into a scratch tensor, off the root).
  virtual WorkPtr gather(const at::Tensor& input, at::Tensor& output, const GatherOptions& opts = {});
  // Rank r's output receives slice r of root's input (size() *
  // output.numel() elements); elsewhere input is not used. Default: a
  // broadcast of the whole input, then each rank's copy of its slice.
  virtual WorkPtr scatter(const at::Tensor& input, at::Tensor& output, const ScatterOptions& opts = {});
  // Rows (dim 0) of input go to the ranks in order: inputSplits[j] rows to
  // rank j; output receives outputSplits[i] rows from rank i, in rank
  // order. Empty splits: equal ones (dim 0 divisible by size()). Splits
  // may be 0; rows have the same shape and dtype everywhere. A rank whose
  // outputSplits disagree with what the others send gets a UsageError
  // naming both counts (every rank fails the same call). Default: every
  // rank's splits are allgathered, waited for in the call, then the padded
  // inputs (memory and bytes: size() times the largest input).
  virtual WorkPtr alltoall(const at::Tensor& input, at::Tensor& output, const std::vector<int64_t>& inputSplits = {},
                           const std::vector<int64_t>& outputSplits = {}, const AlltoallOptions& opts = {});

  // Point to point: not collective; only the two ranks take part. send
  // reads the tensor until its Work completes (leave it unmodified until
  // then, as for every operation); recv fills `tensor` (same
  // dtype and element count as sent, else the recv fails naming both) with
  // the first message from `src` (kAnySourceRank: any rank; the Work's
  // sourceRank() says which) with that tag: messages of one sender arrive
  // in order, and tags may be received in any order. A peer that dies fails
  // the recvs waiting on it at once, naming it. A send or recv that fails
  // (a dead peer, a count or dtype mismatch, a timeout) breaks the group as
  // a failed collective does. Default: NotSupportedError. (NCCL has
  // neither tags nor any-source receives: backends/nccl.)
  virtual WorkPtr send(const at::Tensor& tensor, int dst, const SendOptions& opts = {});
  virtual WorkPtr recv(at::Tensor& tensor, int src, const RecvOptions& opts = {});

  // A zero-filled 1-D tensor for repeated collectives (DDP's gradient
  // buckets), placed where the backend moves it fastest: for gloo on one
  // host, shared memory that the peers reduce in place, with no copy in or
  // out. Collective: every rank calls it in the same order with the same
  // numel and dtype. The default is at::zeros. It stays valid after the
  // group is destroyed.
  virtual at::Tensor allocateCommunicationBuffer(int64_t numel, const at::TensorOptions& options);

  // Breaks the group from any thread: the collective in progress (one run
  // in its caller included) and every later one fail with CollectiveError
  // `reason`, and, where the backend can tell them, so do the peers' (gloo:
  // through shared memory and by interrupting its TCP waits). For a caller
  // that knows a peer is gone before any timeout could say so (an elastic
  // member whose heartbeat stopped). Default: nothing; the collective runs
  // to its own timeout. Gloo and NCCL implement it (NCCL's peers learn of it
  // only through their own timeout or abort).
  virtual void abort(const std::string& reason) { (void)reason; }

 protected:
  [[noreturn]] void notSupported(const std::string& operation) const;
  Milliseconds resolveTimeout(Milliseconds requested) const {
    return requested.count() > 0 ? requested : options_.timeout;
  }

  const int rank_;
  const int size_;
  const ProcessGroupOptions options_;
};

using ProcessGroupPtr = std::shared_ptr<ProcessGroup>;

// "float32", "bfloat16", ... ; the names used in errors and benchmarks.
std::string dtypeName(const at::Tensor& t);

}  // namespace ddp
