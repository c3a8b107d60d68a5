// ProcessGroupGloo: the ProcessGroup contract (framework/process_group.hpp)
// over the Gloo library's TCP transport, for CPU tensors.
//
// - Ranks meet through gloo::rendezvous over our Store, then hold one TCP
//   connection per peer. The transport binds to the interface that reaches
//   MASTER_ADDR (ProcessGroupOptions::masterAddr), or to GLOO_SOCKET_IFNAME
//   / ProcessGroupOptions::interface when set.
// - One worker thread runs the collectives in call order; callers get a
//   Work at once. Non-contiguous or non-CPU tensors are staged through a
//   contiguous host copy.
// - Allreduce and reduce_scatter use our own pipelined ring over Gloo's
//   unbound buffers (faster than Gloo's ring at every size measured; see
//   docs/performance.md). Broadcast, allgather and barrier use Gloo's.
// - Before each collective a rank sends a 32-byte descriptor (sequence
//   number, operation, dtype, element count, root) to its right neighbour
//   and checks the one from its left, so ranks that disagree fail with a
//   CollectiveError before any payload moves.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "framework/backend_registry.hpp"
#include "framework/process_group.hpp"
#include "framework/store.hpp"

namespace gloo {
class Context;
}

namespace ddp {

class ProcessGroupGloo : public ProcessGroup {
 public:
  ProcessGroupGloo(std::shared_ptr<Store> store, int rank, int size, ProcessGroupOptions options);
  ~ProcessGroupGloo() override;

  std::string backendName() const override { return "gloo"; }

  WorkPtr allreduce(at::Tensor& tensor, const AllreduceOptions& opts = {}) override;
  WorkPtr broadcast(at::Tensor& tensor, const BroadcastOptions& opts = {}) override;
  WorkPtr allgather(const at::Tensor& input, at::Tensor& output, const AllgatherOptions& opts = {}) override;
  WorkPtr reduceScatter(const at::Tensor& input, at::Tensor& output,
                        const ReduceScatterOptions& opts = {}) override;
  WorkPtr barrier(const BarrierOptions& opts = {}) override;

  // The address the transport listens on, e.g. "10.0.0.2" (for tests of
  // interface selection).
  const std::string& listenAddress() const { return listenAddress_; }

  // What one queued collective needs; public only for the .cpp's helpers.
  struct Descriptor {
    uint64_t seq = 0;
    uint32_t op = 0;  // OpCode
    uint32_t dtype = 0;
    int64_t numel = 0;
    int32_t root = 0;
    int32_t reduceOp = 0;
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
  void checkAgreement(const Descriptor& mine, Deadline deadline);
  void ringReduceScatter(uint8_t* data, size_t count, size_t elementSize, int reduceOp, int dtype,
                         uint64_t seq, Deadline deadline, bool thenAllgather);

  std::shared_ptr<gloo::Context> context_;
  std::string listenAddress_;
  std::vector<uint8_t> scratch_;  // receive space for the ring; worker thread only

  std::mutex mutex_;
  std::condition_variable queued_;
  std::deque<Task> queue_;
  bool stopping_ = false;
  uint64_t nextSeq_ = 0;
  std::exception_ptr broken_;  // first failure; later collectives fail with it
  std::thread worker_;
};

void registerGlooBackend(BackendRegistry& registry);

// The local IP address whose route reaches `host` (no packet is sent).
std::string localAddressTowards(const std::string& host);

}  // namespace ddp
