#include "backends/gloo/frames.hpp"

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <cstring>

#include "backends/gloo/peer_wait.hpp"
#include "backends/gloo/slots.hpp"
#include "framework/core/errors.hpp"

namespace ddp::gloo_backend {

FrameExchange::FrameExchange(::gloo::Context& context, int rank, int size) : rank_(rank), size_(size) {
  if (size_ <= kAllToAllMaxRanks) {
    for (int r = 0; r < size_; ++r) {
      if (r != rank_) peers_.push_back(r);
    }
  } else {
    peers_ = {(rank_ + 1) % size_};  // sent to the right, received from the left
  }
  // Above kAllToAllMaxRanks no payload travels in frames: a descriptor each.
  frameBytes_ = size_ <= kAllToAllMaxRanks ? kFrameBytes : sizeof(Descriptor);
  sendFrame_.assign(frameBytes_, 0);
  sendBuffer_ = context.createUnboundBuffer(sendFrame_.data(), frameBytes_);
  for (int b = 0; b < 2; ++b) {
    recvFrames_[b].assign(frameBytes_ * size_, 0);
    recvBuffers_[b].resize(size_);
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      recvBuffers_[b][peer] = context.createUnboundBuffer(recvFrames_[b].data() + peer * frameBytes_, frameBytes_);
    }
  }
  postReceives(0);
  postReceives(1);
}

FrameExchange::~FrameExchange() {
  // Unbound buffers first (pending receives into them are dropped), then the memory.
  sendBuffer_.reset();
  recvBuffers_[0].clear();
  recvBuffers_[1].clear();
}

std::vector<int> FrameExchange::peersIn() const {
  return size_ <= kAllToAllMaxRanks ? peers_ : std::vector<int>{(rank_ + size_ - 1) % size_};
}

// Frames of collective `seq` land in recvFrames_[seq % 2], rank p's at
// offset p * frameBytes_. A frame may be shorter than the buffer posted for
// it (Gloo allows a send up to the receive's size): the descriptor in it
// says how long its payload is.
void FrameExchange::postReceives(uint64_t seq) {
  auto& buffers = recvBuffers_[seq % 2];
  const uint64_t slot = slotFor(seq, kFramePhase);
  for (int peer : peersIn()) buffers[peer]->recv(peer, slot, 0, frameBytes_);
}

std::vector<const uint8_t*> FrameExchange::exchange(const Descriptor& mine, const void* payload,
                                                    size_t payloadBytes, Deadline deadline, int onlyFrom) {
  DDP_CHECK(sizeof(Descriptor) + payloadBytes <= frameBytes_, "frame payload too large");
  settleDeferred(deadline);
  std::memcpy(sendFrame_.data(), &mine, sizeof(mine));
  if (payloadBytes) std::memcpy(sendFrame_.data() + sizeof(Descriptor), payload, payloadBytes);
  const uint64_t slot = slotFor(mine.seq, kFramePhase);
  // Only the bytes used: a 4 KiB allreduce puts 4 KiB on the wire, not the
  // whole frame (at 1 Gbit/s, 64 KiB take half a millisecond).
  for (int peer : peers_) sendBuffer_->send(peer, slot, 0, sizeof(Descriptor) + payloadBytes);
  uint8_t* frames = recvFrames_[mine.seq % 2].data();
  std::vector<const uint8_t*> payloads(size_, nullptr);
  for (int from : peersIn()) {
    if (onlyFrom >= 0 && from != onlyFrom) {
      deferredFrom_.push_back(from);
      continue;
    }
    waitRecvFrom(*recvBuffers_[mine.seq % 2][from], from, deadline,
                 fmt::format("its frame of collective #{} was not received", mine.seq));
    const uint8_t* frame = frames + static_cast<size_t>(from) * frameBytes_;
    Descriptor theirs;
    std::memcpy(&theirs, frame, sizeof(theirs));
    checkPeerDescriptor(rank_, size_, mine, theirs, from);
    payloads[from] = frame + sizeof(Descriptor);
  }
  if (!deferredFrom_.empty()) {
    deferred_ = true;
    deferredMine_ = mine;
  }
  return payloads;
}

void FrameExchange::settleDeferred(Deadline deadline) {
  if (!deferred_) return;
  const uint64_t seq = deferredMine_.seq;
  for (int from : deferredFrom_) {
    waitRecvFrom(*recvBuffers_[seq % 2][from], from, deadline,
                 fmt::format("its frame of collective #{} was not received", seq));
    Descriptor theirs;
    std::memcpy(&theirs, recvFrames_[seq % 2].data() + static_cast<size_t>(from) * frameBytes_, sizeof(theirs));
    checkPeerDescriptor(rank_, size_, deferredMine_, theirs, from);
  }
  deferredFrom_.clear();
  deferred_ = false;
  postReceives(seq + 2);
}

void FrameExchange::finish(uint64_t seq, Deadline deadline) {
  // The frame buffers of this collective are consumed (unless some wait for
  // the next collective): reuse them two ahead.
  if (!(deferred_ && deferredMine_.seq == seq)) postReceives(seq + 2);
  for (size_t i = 0; i < peers_.size(); ++i) sendBuffer_->waitSend(remaining(deadline));
}

}  // namespace ddp::gloo_backend
