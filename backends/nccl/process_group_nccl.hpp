// ProcessGroupNccl: the ProcessGroup contract (framework/comm/process_group.hpp)
// over NCCL, for GPUs.
//
// - One communicator per group. Rank 0 creates the unique id and shares it
//   through the Store; every rank then initialises the communicator on its
//   device (ProcessGroupOptions::deviceIndex, or LOCAL_RANK modulo the
//   devices seen). NCCL does not allow two ranks of one group on the same
//   GPU. The communicator is non-blocking (NCCL >= 2.14), so that a peer
//   that never arrives fails the constructor after the group's timeout
//   instead of hanging it.
// - Collectives run on the group's own CUDA stream. With a CUDA build of
//   LibTorch they wait first (by an event) for the stream that produced the
//   tensor, and keep the tensor alive until the operation has finished; with
//   a CPU-only LibTorch, CPU tensors are staged through device buffers with
//   the CUDA runtime (CPU tensors take that path with any LibTorch).
// - A Work completes when the event recorded after its operation does. A
//   watchdog thread polls the events and ncclCommGetAsyncError; when an
//   operation outlives its timeout or NCCL reports an error, it aborts the
//   communicator and fails every pending Work naming rank, operation,
//   sequence number and element count. The group is then broken.
// - abort(reason), from any thread: the watchdog aborts the communicator
//   (ncclCommAbort ends kernels that wait for a peer), fails every pending
//   Work and every later operation with `reason`. Peers learn of it only
//   through their own timeouts or their own abort (NCCL has no side channel
//   here, unlike gloo's shared memory).
// - Unlike Gloo, NCCL cannot see that ranks disagree on element counts; such
//   a mistake surfaces as a timeout.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "framework/comm/backend_registry.hpp"
#include "framework/comm/collective_args.hpp"
#include "framework/comm/process_group.hpp"
#include "framework/store/store.hpp"

namespace ddp {

class ProcessGroupNccl : public ProcessGroup {
 public:
  ProcessGroupNccl(std::shared_ptr<Store> store, int rank, int size, ProcessGroupOptions options);
  ~ProcessGroupNccl() override;

  std::string backendName() const override { return "nccl"; }
  int device() const { return device_; }

  WorkPtr allreduce(at::Tensor& tensor, const AllreduceOptions& opts = {}) override;
  WorkPtr broadcast(at::Tensor& tensor, const BroadcastOptions& opts = {}) override;
  WorkPtr allgather(const at::Tensor& input, at::Tensor& output, const AllgatherOptions& opts = {}) override;
  WorkPtr reduceScatter(const at::Tensor& input, at::Tensor& output,
                        const ReduceScatterOptions& opts = {}) override;
  WorkPtr barrier(const BarrierOptions& opts = {}) override;
  // alltoall, gather and scatter: ncclSend/ncclRecv of a block per pair of
  // ranks in one group call (reduce is the allreduce default).
  WorkPtr alltoall(const at::Tensor& input, at::Tensor& output, const std::vector<int64_t>& inputSplits = {},
                   const std::vector<int64_t>& outputSplits = {}, const AlltoallOptions& opts = {}) override;
  WorkPtr gather(const at::Tensor& input, at::Tensor& output, const GatherOptions& opts = {}) override;
  WorkPtr scatter(const at::Tensor& input, at::Tensor& output, const ScatterOptions& opts = {}) override;
  // ncclSend / ncclRecv on the group's stream. NCCL has no tags (a nonzero
  // tag is a UsageError) and no receive from any source: messages between
  // two ranks match in call order. Both run on one stream, so two ranks
  // that each send to the other before receiving wait for each other
  // until the timeout: let one of them receive first (or use alltoall).
  WorkPtr send(const at::Tensor& tensor, int dst, const SendOptions& opts = {}) override;
  WorkPtr recv(at::Tensor& tensor, int src, const RecvOptions& opts = {}) override;
  void abort(const std::string& reason) override;

  struct Impl;  // CUDA and NCCL handles; defined in the .cpp

 private:
  // Issues one operation: `issue(send, recv, stream)` enqueues the NCCL call
  // on device pointers that launch() prepared and returns its ncclResult_t.
  // How the operation uses its tensors: in place (in is out), in to out,
  // or one way only: a send's input is only read (nothing comes back into
  // it), a recv's output only written (nothing goes up from it).
  enum class Flow { InPlace, OutOfPlace, SendOnly, ReceiveOnly };
  // `sourceRank` >= 0: a recv's Work, which names that sender.
  WorkPtr launch(const char* op, const at::Tensor& in, const at::Tensor& out, Flow flow,
                 Milliseconds timeout, const std::string& summary,
                 const std::function<int(void* send, void* recv, void* stream)>& issue, int sourceRank = -1);
  // One group call of ncclSend/ncclRecv, a block per pair (counts and
  // offsets in elements); returns its ncclResult_t.
  int issueBlocks(void* send, void* recv, void* stream, at::ScalarType dtype, const BlockCounts& blocks);
  void watchdogLoop();
  // Without Impl::mutex held: ncclCommAbort once no NCCL call runs on the
  // communicator, which is then null; later launches fail naming `why`.
  void abortCommunicator(const std::string& why);

  std::unique_ptr<Impl> impl_;
  int device_ = 0;
  uint64_t nextSeq_ = 0;
  std::thread watchdog_;
};

void registerNcclBackend(BackendRegistry& registry);

// CUDA devices visible to this process (0 without a driver).
int cudaDeviceCount();

}  // namespace ddp
