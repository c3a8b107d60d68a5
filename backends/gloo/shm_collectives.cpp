#include "backends/gloo/shm_collectives.hpp"

#include <ATen/ATen.h>
#include <algorithm>
#include <cstring>

#include "backends/gloo/shm_channel.hpp"
#include "framework/core/errors.hpp"
#include "framework/core/help_links.hpp"

namespace ddp::gloo_backend {

ShmCollectives::ShmCollectives(std::unique_ptr<ShmChannel> channel, int rank, int size)
    : shm_(std::move(channel)), rank_(rank), size_(size) {}

void ShmCollectives::setSpin(std::chrono::nanoseconds spin) { shm_->setSpin(spin); }

ShmCollectives::~ShmCollectives() = default;

void ShmCollectives::markFailed() { shm_->markFailed(); }

void ShmCollectives::beginRound(const Descriptor& d, bool first) {
  static_assert(sizeof(Descriptor) <= ShmChannel::kDescriptorBytes, "descriptor must fit its shared slot");
  shm_->beginRound();
  if (first) std::memcpy(shm_->descriptor(rank_), &d, sizeof(d));
}

void ShmCollectives::checkDescriptors(const Descriptor& mine) {
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    Descriptor theirs;
    std::memcpy(&theirs, shm_->descriptor(p), sizeof(theirs));
    checkPeerDescriptor(rank_, size_, mine, theirs, p);
  }
}

void ShmCollectives::barrier(const Descriptor& d, Deadline deadline) {
  beginRound(d, true);
  shm_->step(deadline);
  checkDescriptors(d);
}

// ---- shared buffers ------------------------------------------------------------
at::Tensor ShmCollectives::allocateBuffer(Store& store, int64_t numel, const at::TensorOptions& options,
                                          std::chrono::milliseconds timeout) {
  const size_t bytes = static_cast<size_t>(numel) * options.dtype().itemsize();
  std::shared_ptr<ShmBuffer> buffer;
  std::string why;
  try {
    buffer = shm_->allocateBuffer(store, bytes, timeout, &why);
  } catch (const std::exception& e) {
    fail<CollectiveError>(
        "[rank {}/{}] gloo: allocating a shared buffer of {} bytes did not complete: {}. HINT: every rank must "
        "allocate the same buffers in the same order; {}",
        rank_, size_, bytes, e.what(), kRendezvousHelp);
  }
  if (!buffer) return at::Tensor();  // every rank falls back
  void* base = buffer->base(rank_);
  {
    std::lock_guard<std::mutex> lock(buffersMutex_);
    for (auto it = buffers_.begin(); it != buffers_.end();) {
      it = it->second.expired() ? buffers_.erase(it) : std::next(it);
    }
    buffers_[base] = buffer;
  }
  // The tensor owns the mappings: it may outlive this group.
  return at::from_blob(base, {numel}, [buffer](void*) mutable { buffer.reset(); }, options);
}

std::shared_ptr<ShmBuffer> ShmCollectives::bufferOf(const at::Tensor& t) {
  if (!t.defined() || !t.is_cpu() || !t.is_contiguous()) return nullptr;
  std::lock_guard<std::mutex> lock(buffersMutex_);
  auto found = buffers_.find(t.data_ptr());
  if (found == buffers_.end()) return nullptr;
  auto buffer = found->second.lock();
  if (!buffer || buffer->bytes() != t.nbytes()) return nullptr;
  return buffer;
}

// On a shared buffer nothing is copied: after a first step (every rank's
// input is in place), rank r reduces part r of all ranks' buffers into rank
// 0's, in rank order (the same bits as allreduce), and writes the result
// into every other rank's buffer; a second step ends it. Nobody touches a
// peer's buffer outside those two steps.
void ShmCollectives::allreduceInPlace(const Descriptor& d, ShmBuffer& buffer, at::Tensor& tensor, ReduceOp op,
                                      Deadline deadline) {
  const size_t es = tensor.element_size(), count = tensor.numel();
  beginRound(d, true);
  shm_->step(deadline);
  checkDescriptors(d);
  const size_t begin = count * rank_ / size_, end = count * (rank_ + 1) / size_;
  if (end > begin) {
    const ReduceFn reduce = reduceFnFor(tensor.scalar_type());
    uint8_t* acc = buffer.base(0) + begin * es;
    for (int p = 1; p < size_; ++p) reduce(acc, buffer.base(p) + begin * es, end - begin, static_cast<int>(op));
    if (op == ReduceOp::Avg) {
      divideInPlace(at::from_blob(acc, {static_cast<int64_t>(end - begin)}, tensor.options()), size_);
    }
    for (int p = 1; p < size_; ++p) std::memcpy(buffer.base(p) + begin * es, acc, (end - begin) * es);
  }
  shm_->step(deadline);
}

// ---- collectives through the slots -----------------------------------------------
// One round per chunk of at most chunkElems of `count` elements (one round
// when count is 0): fill(at, len) writes this rank's slot, every rank steps,
// the first round checks the descriptors, then consume(at, len) reads.
template <typename Fill, typename Consume>
void ShmCollectives::rounds(const Descriptor& d, size_t count, size_t chunkElems, Deadline deadline, Fill&& fill,
                            Consume&& consume) {
  size_t at = 0;
  bool first = true;
  do {
    const size_t len = std::min(chunkElems, count - at);
    beginRound(d, first);
    fill(at, len);
    shm_->step(deadline);
    if (first) checkDescriptors(d);
    first = false;
    consume(at, len);
    at += len;
  } while (at < count);
}

// Rank r reduces the r-th part of each chunk into rank 0's slot, peers in
// rank order (the same bits on every rank); then every rank copies the
// whole reduced chunk out.
void ShmCollectives::allreduce(const Descriptor& d, at::Tensor& host, ReduceOp op, Deadline deadline) {
  const size_t es = host.element_size();
  uint8_t* data = static_cast<uint8_t*>(host.data_ptr());
  const ReduceFn reduce = reduceFnFor(host.scalar_type());
  rounds(
      d, host.numel(), shm_->slotBytes() / es, deadline,
      [&](size_t at, size_t len) {
        if (len) std::memcpy(shm_->slot(rank_), data + at * es, len * es);
      },
      [&](size_t at, size_t len) {
        const size_t begin = len * rank_ / size_, end = len * (rank_ + 1) / size_;
        if (end > begin) {
          uint8_t* acc = shm_->slot(0) + begin * es;
          for (int p = 1; p < size_; ++p) reduce(acc, shm_->slot(p) + begin * es, end - begin, static_cast<int>(op));
          if (op == ReduceOp::Avg) {
            divideInPlace(at::from_blob(acc, {static_cast<int64_t>(end - begin)}, host.options()), size_);
          }
        }
        shm_->step(deadline);  // every part reduced
        if (len) std::memcpy(data + at * es, shm_->slot(0), len * es);
      });
}

// Each rank lays its input blocks side by side in its slot, a chunk of each
// block per round; rank r reduces block r straight into its output.
void ShmCollectives::reduceScatter(const Descriptor& d, const at::Tensor& in, at::Tensor& out, ReduceOp op,
                                   Deadline deadline) {
  const size_t es = in.element_size(), blockElems = out.numel();
  const uint8_t* src = static_cast<const uint8_t*>(in.data_ptr());
  uint8_t* dst = static_cast<uint8_t*>(out.data_ptr());
  const ReduceFn reduce = reduceFnFor(in.scalar_type());
  rounds(
      d, blockElems, std::max<size_t>(1, shm_->slotBytes() / (es * size_)), deadline,
      [&](size_t at, size_t len) {
        for (int b = 0; b < size_ && len; ++b) {
          std::memcpy(shm_->slot(rank_) + b * len * es, src + (b * blockElems + at) * es, len * es);
        }
      },
      [&](size_t at, size_t len) {
        if (!len) return;
        uint8_t* acc = dst + at * es;
        std::memcpy(acc, shm_->slot(0) + rank_ * len * es, len * es);
        for (int p = 1; p < size_; ++p) reduce(acc, shm_->slot(p) + rank_ * len * es, len, static_cast<int>(op));
        if (op == ReduceOp::Avg) divideInPlace(at::from_blob(acc, {static_cast<int64_t>(len)}, out.options()), size_);
      });
}

void ShmCollectives::broadcast(const Descriptor& d, at::Tensor& host, int root, Deadline deadline) {
  const size_t es = host.element_size();
  uint8_t* data = static_cast<uint8_t*>(host.data_ptr());
  rounds(
      d, host.numel(), shm_->slotBytes() / es, deadline,
      [&](size_t at, size_t len) {
        if (rank_ == root && len) std::memcpy(shm_->slot(root), data + at * es, len * es);
      },
      [&](size_t at, size_t len) {
        if (rank_ != root && len) std::memcpy(data + at * es, shm_->slot(root), len * es);
      });
}

void ShmCollectives::allgather(const Descriptor& d, const at::Tensor& in, at::Tensor& out, Deadline deadline) {
  const size_t es = in.element_size(), count = in.numel();
  const uint8_t* src = static_cast<const uint8_t*>(in.data_ptr());
  uint8_t* dst = static_cast<uint8_t*>(out.data_ptr());
  rounds(
      d, count, shm_->slotBytes() / es, deadline,
      [&](size_t at, size_t len) {
        if (len) std::memcpy(shm_->slot(rank_), src + at * es, len * es);
      },
      [&](size_t at, size_t len) {
        for (int p = 0; p < size_ && len; ++p) std::memcpy(dst + (p * count + at) * es, shm_->slot(p), len * es);
      });
}

std::vector<const uint8_t*> ShmCollectives::exchange(const Descriptor& d, const void* mine, size_t bytes,
                                                     Deadline deadline) {
  DDP_CHECK(bytes <= shm_->slotBytes(), "shared-memory exchange larger than a slot");
  beginRound(d, true);
  if (bytes) std::memcpy(shm_->slot(rank_), mine, bytes);
  shm_->step(deadline);
  checkDescriptors(d);
  std::vector<const uint8_t*> areas;
  for (int p = 0; p < size_; ++p) areas.push_back(shm_->slot(p));
  return areas;
}

// Each round, rank r lays the next piece of its block for each rank j at
// j's share of its slot; after the step, rank j copies its share out of
// every rank's slot. Pieces past a pair's count are empty.
void ShmCollectives::moveBlocks(const Descriptor& d, const uint8_t* src, uint8_t* dst, size_t es,
                                const std::vector<int64_t>& sendAt, const std::vector<int64_t>& sendCount,
                                const std::vector<int64_t>& recvAt, const std::vector<int64_t>& recvCount,
                                int64_t maxCount, bool first, Deadline deadline) {
  const int64_t share = std::max<int64_t>(1, static_cast<int64_t>(shm_->slotBytes() / (es * size_)));
  const auto piece = [&](int64_t count, int64_t at) { return std::max<int64_t>(0, std::min(share, count - at)); };
  if (!first && maxCount == 0) return;
  int64_t at = 0;
  do {
    beginRound(d, first);
    for (int j = 0; j < size_; ++j) {
      const int64_t len = piece(sendCount[j], at);
      if (len > 0 && j != rank_) std::memcpy(shm_->slot(rank_) + j * share * es, src + (sendAt[j] + at) * es, len * es);
    }
    shm_->step(deadline);
    if (first) checkDescriptors(d);
    first = false;
    for (int i = 0; i < size_; ++i) {
      const int64_t len = piece(recvCount[i], at);
      if (len > 0 && i != rank_) std::memcpy(dst + (recvAt[i] + at) * es, shm_->slot(i) + rank_ * share * es, len * es);
    }
    at += share;
  } while (at < maxCount);
}

}  // namespace ddp::gloo_backend
