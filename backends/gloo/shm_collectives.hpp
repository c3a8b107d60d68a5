// ShmCollectives: ProcessGroupGloo's collectives when every rank shares a
// host, over a ShmChannel (shm_channel.hpp), and the communication buffers
// that live in shared memory.
//
// Each collective is a sequence of rounds over chunks of at most one slot;
// the first round carries every rank's descriptor, checked after its first
// step, before any rank reads a peer's payload. Reductions run in rank order
// (the same bits on every rank) and in parallel: rank r reduces part r.
// An allreduce on a buffer from allocateBuffer() moves no data at all: the
// ranks reduce straight in each other's buffers. Collectives are the worker
// thread's only; allocateBuffer() and bufferOf() may be called from any
// thread.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backends/gloo/descriptor.hpp"
#include "backends/gloo/host_tensors.hpp"

namespace ddp {
class Store;
class ShmBuffer;
class ShmChannel;
}  // namespace ddp

namespace ddp::gloo_backend {

class ShmCollectives {
 public:
  ShmCollectives(std::unique_ptr<ShmChannel> channel, int rank, int size);
  ~ShmCollectives();

  void barrier(const Descriptor& d, Deadline deadline);
  // These take contiguous host tensors; the reductions divide for Avg.
  void allreduce(const Descriptor& d, at::Tensor& host, ReduceOp op, Deadline deadline);
  void allreduceInPlace(const Descriptor& d, ShmBuffer& buffer, at::Tensor& tensor, ReduceOp op,
                        Deadline deadline);
  void reduceScatter(const Descriptor& d, const at::Tensor& in, at::Tensor& out, ReduceOp op, Deadline deadline);
  void broadcast(const Descriptor& d, at::Tensor& host, int root, Deadline deadline);
  void allgather(const Descriptor& d, const at::Tensor& in, at::Tensor& out, Deadline deadline);
  // One round in which every rank publishes `bytes` (at most a slot) and
  // reads the others': their areas by rank (this rank's too), valid until
  // the next collective begins. The descriptors are checked first.
  std::vector<const uint8_t*> exchange(const Descriptor& d, const void* mine, size_t bytes, Deadline deadline);
  // A block per ordered pair of ranks (alltoall, gather, scatter): the
  // `sendCount[j]` elements at `src + sendAt[j]` go to rank j, and rank i's
  // arrive at `dst + recvAt[i]`, in rounds of a slot's share per pair.
  // `maxCount` is the largest count of any pair, the same on every rank (it
  // sets the number of rounds). `first`: the first round carries and
  // checks the descriptors (else exchange() did).
  void moveBlocks(const Descriptor& d, const uint8_t* src, uint8_t* dst, size_t elementSize,
                  const std::vector<int64_t>& sendAt, const std::vector<int64_t>& sendCount,
                  const std::vector<int64_t>& recvAt, const std::vector<int64_t>& recvCount, int64_t maxCount,
                  bool first, Deadline deadline);
  // Tells the peers that this rank failed, so that they stop waiting.
  void markFailed();
  // ShmChannel::setSpin: how long waits spin before they sleep.
  void setSpin(std::chrono::nanoseconds spin);

  // Collective over `store` (the same calls in the same order on every
  // rank): a tensor of `numel` elements in shared memory, or an undefined
  // tensor on every rank when that is not possible.
  at::Tensor allocateBuffer(Store& store, int64_t numel, const at::TensorOptions& options,
                            std::chrono::milliseconds timeout);
  // The shared buffer that `t` is exactly, if any.
  std::shared_ptr<ShmBuffer> bufferOf(const at::Tensor& t);

 private:
  void beginRound(const Descriptor& d, bool first);
  void checkDescriptors(const Descriptor& mine);
  template <typename Fill, typename Consume>
  void rounds(const Descriptor& d, size_t count, size_t chunkElems, Deadline deadline, Fill&& fill,
              Consume&& consume);

  std::unique_ptr<ShmChannel> shm_;
  int rank_, size_;
  std::mutex buffersMutex_;
  std::map<const void*, std::weak_ptr<ShmBuffer>> buffers_;  // by this rank's base address
};

}  // namespace ddp::gloo_backend
