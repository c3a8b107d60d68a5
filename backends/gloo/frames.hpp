// FrameExchange: the frame with which every TCP collective of
// ProcessGroupGloo starts, over the rank's own connections (framework/comm/links.hpp).
//
// Each rank sends one frame to each other rank (a Mesh of connections);
// above kAllToAllMaxRanks ranks, to its right neighbour only (a Ring). A
// frame is a small header (its payload's length), this collective's
// Descriptor, then up to kSmallPayloadBytes of payload. Every received
// descriptor is checked against this rank's own before anything else
// happens. Collectives whose payload fits a frame (smallPath) are that one
// network hop; larger ones send an empty frame, then use the ring.
//
// The worker thread reads the frames itself, from non-blocking sockets in
// one poll() loop that also finishes its own sends: no transport thread
// hands them over. Every rank waits for every frame it receives, even a
// broadcast's non-roots' (reading those later gained nothing measurable
// and would let ranks that disagree succeed), so ranks that disagree
// always fail before any payload moves. The worker thread's only: not
// thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "backends/gloo/descriptor.hpp"
#include "backends/gloo/host_tensors.hpp"
#include "framework/comm/links.hpp"

namespace ddp::gloo_backend {

class FrameExchange {
 public:
  static constexpr size_t kSmallPayloadBytes = 64 * 1024;
  static constexpr int kAllToAllMaxRanks = 8;
  // What one rank may send in all its frames of a collective: beyond it,
  // the ring's 2 N bytes beat (size - 1) N.
  static constexpr size_t kAllToAllBudgetBytes = 128 * 1024;

  // Whether a payload of `bytes` travels inside the frames of a group of
  // `size` ranks: up to 64 KiB at 2 and 3 ranks, 42 KiB at 4, 18 KiB at 8.
  static bool fits(size_t bytes, int size) {
    return bytes <= kSmallPayloadBytes && size <= kAllToAllMaxRanks &&
           bytes * static_cast<size_t>(size - 1) <= kAllToAllBudgetBytes;
  }
  // The shape of connections frames need at `size` ranks.
  static Links::Shape shapeFor(int size) {
    return size <= kAllToAllMaxRanks ? Links::Shape::Mesh : Links::Shape::Ring;
  }

  explicit FrameExchange(std::unique_ptr<Links> links);
  ~FrameExchange();
  FrameExchange(const FrameExchange&) = delete;
  FrameExchange& operator=(const FrameExchange&) = delete;

  // Sends this collective's frame (`mine`, then `payload`) and checks the
  // peers' frames; returns their payload areas by rank (null for this rank,
  // and for ranks whose frames we do not receive). Valid until the next
  // exchange. A peer whose frame does not come by the deadline throws
  // std::runtime_error "rank P did not arrive before the timeout (...)".
  std::vector<const uint8_t*> exchange(const Descriptor& mine, const void* payload, size_t payloadBytes,
                                       Deadline deadline);

  // Whether frames go to every rank (a mesh), as exchangeThenTransfer needs.
  bool isMesh() const { return links_->size() <= kAllToAllMaxRanks; }

  // A frame per rank and then a block per pair of ranks, for alltoall, over
  // the mesh (isMesh()): sends this rank's frame (`mine`, then `payload`)
  // and right behind it sendBlocks[p] to each peer p, without waiting;
  // reads and checks every peer's frame; once all are in, calls
  // check(payloads by rank, null for this rank), which may throw (no block
  // has been read then); then reads recvBlocks[p] from each peer. One poll
  // loop (transferAll), all pairs at once. (Sending the blocks only after
  // the check took twice as long at 4 KiB to 4 MiB.)
  struct Span {
    void* data = nullptr;
    size_t bytes = 0;
  };
  void exchangeThenTransfer(const Descriptor& mine, const void* payload, size_t payloadBytes,
                            const std::vector<Span>& sendBlocks, const std::vector<Span>& recvBlocks,
                            const std::function<void(const std::vector<const uint8_t*>&)>& check, Deadline deadline);

  // From any thread: a running or later exchange fails at once.
  void interrupt() { links_->interrupt(); }
  // On the thread that runs collectives, after one failed: Links::reset().
  void reset() { links_->reset(); }

 private:
  struct Header {
    uint32_t payloadBytes;
    uint32_t reserved;
    Descriptor descriptor;
  };
  // Reading one peer's frame.
  struct Reader {
    int peer = -1;
    size_t done = 0;  // bytes of the frame read
    std::vector<uint8_t> frame;
  };

  std::unique_ptr<Links> links_;
  std::vector<int> peersOut_;       // ranks we send frames to
  std::vector<Reader> readers_;     // ranks we receive frames from
  std::vector<uint8_t> sendFrame_;  // header and payload
};

}  // namespace ddp::gloo_backend
