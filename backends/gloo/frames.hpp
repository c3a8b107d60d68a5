// FrameExchange: the fixed-size frame with which every TCP collective of
// ProcessGroupGloo starts.
//
// Each rank sends one frame to each other rank (to its right neighbour only
// above kAllToAllMaxRanks ranks). A frame is this collective's Descriptor,
// then up to kSmallPayloadBytes of payload, and is as long as its payload:
// receives are posted for the largest frame. Frames
// are received into buffers posted two collectives ahead (set seq % 2), so
// a frame needs no "ready to receive" round trip: one network hop. Every
// received descriptor is checked against this rank's own before anything
// else happens. Collectives whose payload fits a frame (smallPath) are that
// one hop; larger ones send an empty frame, then use the ring or Gloo's own
// algorithms. The worker thread's only: not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "backends/gloo/descriptor.hpp"
#include "backends/gloo/host_tensors.hpp"

namespace gloo {
class Context;
namespace transport {
class UnboundBuffer;
}
}  // namespace gloo

namespace ddp::gloo_backend {

class FrameExchange {
 public:
  static constexpr size_t kSmallPayloadBytes = 64 * 1024;
  static constexpr int kAllToAllMaxRanks = 8;
  // What one rank may send in all its frames of a collective: beyond it,
  // the ring's 2 N bytes beat (size - 1) N.
  static constexpr size_t kAllToAllBudgetBytes = 128 * 1024;
  static constexpr size_t kFrameBytes = sizeof(Descriptor) + kSmallPayloadBytes;

  // Whether a payload of `bytes` travels inside the frames of a group of
  // `size` ranks: up to 64 KiB at 2 and 3 ranks, 42 KiB at 4, 18 KiB at 8.
  static bool fits(size_t bytes, int size) {
    return bytes <= kSmallPayloadBytes && size <= kAllToAllMaxRanks &&
           bytes * static_cast<size_t>(size - 1) <= kAllToAllBudgetBytes;
  }

  // Posts the receives of collectives 0 and 1 on `context` (size > 1).
  FrameExchange(::gloo::Context& context, int rank, int size);
  ~FrameExchange();
  FrameExchange(const FrameExchange&) = delete;
  FrameExchange& operator=(const FrameExchange&) = delete;

  // Sends this collective's frame (`mine`, then `payload`) and checks the
  // peers' frames; returns their payload areas by rank (null for this rank,
  // and for ranks whose frames we do not receive). Valid until finish().
  //
  // With `onlyFrom` >= 0 (a broadcast's root), only that rank's frame is
  // waited for now; the others' are checked at the start of the next
  // collective (or never, if there is none: they still check ours, so a
  // mismatch is still found, by them). Their payload pointers are null. A
  // root thus sends and goes on, as c10d's does, instead of waiting a round
  // trip for every rank to arrive; it runs at most one collective ahead.
  std::vector<const uint8_t*> exchange(const Descriptor& mine, const void* payload, size_t payloadBytes,
                                       Deadline deadline, int onlyFrom = -1);
  // After collective `seq` ran: reposts its receive buffers for seq + 2
  // (once its deferred frames are in) and waits until this rank's frames
  // are sent.
  void finish(uint64_t seq, Deadline deadline);

 private:
  void postReceives(uint64_t seq);
  // The ranks whose frames we receive: every other, or the left neighbour.
  std::vector<int> peersIn() const;

  // Waits for and checks the frames deferred by the previous collective,
  // then reposts their buffers.
  void settleDeferred(Deadline deadline);

  int rank_, size_;
  // The previous collective's frames not yet waited for (onlyFrom).
  Descriptor deferredMine_{};
  std::vector<int> deferredFrom_;
  bool deferred_ = false;
  std::vector<int> peers_;  // ranks we send frames to and expect frames from
  size_t frameBytes_ = kFrameBytes;  // the buffer of one frame
  // Memory before the unbound buffers over it: destroyed after them.
  std::vector<uint8_t> sendFrame_;
  std::vector<uint8_t> recvFrames_[2];  // [seq % 2]: one frame per rank
  std::unique_ptr<::gloo::transport::UnboundBuffer> sendBuffer_;
  // [seq % 2][peer]: one unbound buffer per peer, since Gloo reports only
  // the rank of the latest completed receive of a buffer.
  std::vector<std::unique_ptr<::gloo::transport::UnboundBuffer>> recvBuffers_[2];
};

}  // namespace ddp::gloo_backend
