#include "backends/gloo/frames.hpp"

#include <fmt/format.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>

#include "framework/core/errors.hpp"

namespace ddp::gloo_backend {

FrameExchange::FrameExchange(std::unique_ptr<Links> links) : links_(std::move(links)) {
  const int n = links_->size(), rank = links_->rank();
  std::vector<int> peersIn;
  if (n <= kAllToAllMaxRanks) {
    for (int p = 0; p < n; ++p) {
      if (p != rank) peersIn.push_back(p);
    }
    peersOut_ = peersIn;
  } else {
    peersOut_ = {links_->right()};
    peersIn = {links_->left()};
  }
  for (int p : peersIn) {
    Reader reader;
    reader.peer = p;
    reader.frame.resize(sizeof(Header) + kSmallPayloadBytes);
    readers_.push_back(std::move(reader));
  }
  sendFrame_.resize(sizeof(Header) + kSmallPayloadBytes);
}

FrameExchange::~FrameExchange() = default;

std::vector<const uint8_t*> FrameExchange::exchange(const Descriptor& mine, const void* payload,
                                                    size_t payloadBytes, Deadline deadline) {
  DDP_CHECK(payloadBytes <= kSmallPayloadBytes, "frame payload too large");
  const int rank = links_->rank(), size = links_->size();
  Header header{static_cast<uint32_t>(payloadBytes), 0, mine};
  std::memcpy(sendFrame_.data(), &header, sizeof header);
  if (payloadBytes) std::memcpy(sendFrame_.data() + sizeof header, payload, payloadBytes);
  const size_t frameBytes = sizeof header + payloadBytes;
  std::vector<size_t> sent(peersOut_.size(), 0);
  std::vector<bool> pending(readers_.size(), true);  // the frame still to read
  std::vector<const uint8_t*> payloads(size, nullptr);

  const std::string what = fmt::format("the frames of collective #{}", mine.seq);
  auto failed = [&](int peer, const std::string& why) {
    if (links_->interrupted()) throw std::runtime_error("interrupted (the frame exchange): the group was aborted");
    throw std::runtime_error(fmt::format("the connection to rank {} failed ({}): {}", peer, what, why));
  };
  for (;;) {
    bool moved = false, busy = false;
    std::string why;
    for (size_t i = 0; i < peersOut_.size(); ++i) {
      while (sent[i] < frameBytes) {
        const ssize_t n = sendSome(links_->to(peersOut_[i]), sendFrame_.data() + sent[i], frameBytes - sent[i], &why);
        if (n < 0) failed(peersOut_[i], why);
        if (n == 0) {
          busy = true;
          break;
        }
        sent[i] += static_cast<size_t>(n);
        moved = true;
      }
    }
    for (size_t i = 0; i < readers_.size(); ++i) {
      Reader& r = readers_[i];
      while (pending[i]) {
        // The header first; then, knowing the payload's length, the rest.
        size_t want = sizeof(Header);
        if (r.done >= sizeof(Header)) want += reinterpret_cast<const Header*>(r.frame.data())->payloadBytes;
        if (r.done < want) {
          const ssize_t n = recvSome(links_->from(r.peer), r.frame.data() + r.done, want - r.done, &why);
          if (n < 0) failed(r.peer, why);
          if (n == 0) {
            busy = true;
            break;
          }
          r.done += static_cast<size_t>(n);
          moved = true;
          if (r.done == sizeof(Header)) {
            const Header* theirs = reinterpret_cast<const Header*>(r.frame.data());
            if (theirs->payloadBytes > kSmallPayloadBytes || theirs->reserved != 0) {
              failed(r.peer, fmt::format("a malformed frame (payload of {} bytes)", theirs->payloadBytes));
            }
          }
          continue;
        }
        // A whole frame: check it against ours.
        Header theirs;
        std::memcpy(&theirs, r.frame.data(), sizeof theirs);
        r.done = 0;
        checkPeerDescriptor(rank, size, mine, theirs.descriptor, r.peer);
        payloads[r.peer] = r.frame.data() + sizeof(Header);
        pending[i] = false;
      }
    }
    bool done = true;
    for (size_t i = 0; i < peersOut_.size(); ++i) done = done && sent[i] == frameBytes;
    for (size_t i = 0; i < readers_.size(); ++i) done = done && !pending[i];
    if (done) break;
    if (moved || !busy) continue;
    // Nothing can move: wait for a socket that can.
    std::vector<pollfd> waits;
    for (size_t i = 0; i < peersOut_.size(); ++i) {
      if (sent[i] < frameBytes) waits.push_back({links_->to(peersOut_[i]), POLLOUT, 0});
    }
    for (size_t i = 0; i < readers_.size(); ++i) {
      if (pending[i]) waits.push_back({links_->from(readers_[i].peer), POLLIN, 0});
    }
    const int ready = pollUntil(waits.data(), waits.size(), deadline);
    if (ready == 0) {
      std::string missing;
      int count = 0;
      for (size_t i = 0; i < readers_.size(); ++i) {
        if (!pending[i]) continue;
        missing += (missing.empty() ? "" : ", ") + std::to_string(readers_[i].peer);
        ++count;
      }
      if (count > 0) {
        throw std::runtime_error(fmt::format(
            "{} {} did not arrive before the timeout ({} frame of collective #{} was not received)",
            count == 1 ? "rank" : "ranks", missing, count == 1 ? "its" : "their", mine.seq));
      }
      for (size_t i = 0; i < peersOut_.size(); ++i) {
        if (sent[i] < frameBytes) {
          throw std::runtime_error(fmt::format(
              "rank {} did not arrive before the timeout (it took no frame of collective #{})", peersOut_[i], mine.seq));
        }
      }
    }
    if (ready < 0 && errno != EINTR) throw std::runtime_error(fmt::format("poll: {}", std::strerror(errno)));
  }
  return payloads;
}

void FrameExchange::exchangeThenTransfer(const Descriptor& mine, const void* payload, size_t payloadBytes,
                                         const std::vector<Span>& sendBlocks, const std::vector<Span>& recvBlocks,
                                         const std::function<void(const std::vector<const uint8_t*>&)>& check,
                                         Deadline deadline) {
  DDP_CHECK(payloadBytes <= kSmallPayloadBytes, "frame payload too large");
  DDP_CHECK(isMesh(), "exchangeThenTransfer needs a mesh");
  const int rank = links_->rank(), size = links_->size();
  Header header{static_cast<uint32_t>(payloadBytes), 0, mine};
  std::memcpy(sendFrame_.data(), &header, sizeof header);
  if (payloadBytes) std::memcpy(sendFrame_.data() + sizeof header, payload, payloadBytes);
  std::vector<LinkTransfer> sends, recvs;
  for (int p : peersOut_) {
    sends.push_back({p, sendFrame_.data(), sizeof header + payloadBytes});
    sends.push_back({p, sendBlocks[static_cast<size_t>(p)].data, sendBlocks[static_cast<size_t>(p)].bytes});
  }
  for (Reader& r : readers_) recvs.push_back({r.peer, r.frame.data(), sizeof(Header), /*stage=*/0});
  const auto afterStage = [&](int stage) {
    if (stage == 0) {  // every header: check it, then read its payload
      for (Reader& r : readers_) {
        Header theirs;
        std::memcpy(&theirs, r.frame.data(), sizeof theirs);
        if (theirs.payloadBytes > kSmallPayloadBytes || theirs.reserved != 0) {
          throw std::runtime_error(fmt::format("the connection to rank {} failed (the frames of collective #{}): a "
                                               "malformed frame (payload of {} bytes)",
                                               r.peer, mine.seq, theirs.payloadBytes));
        }
        checkPeerDescriptor(rank, size, mine, theirs.descriptor, r.peer);
        recvs.push_back({r.peer, r.frame.data() + sizeof(Header), theirs.payloadBytes, /*stage=*/1});
      }
    } else if (stage == 1) {  // every payload: the caller's check, then the blocks
      std::vector<const uint8_t*> payloads(static_cast<size_t>(size), nullptr);
      for (Reader& r : readers_) payloads[static_cast<size_t>(r.peer)] = r.frame.data() + sizeof(Header);
      check(payloads);
      for (Reader& r : readers_) {
        const Span& block = recvBlocks[static_cast<size_t>(r.peer)];
        recvs.push_back({r.peer, block.data, block.bytes, /*stage=*/2});
      }
    }
  };
  transferAll(*links_, sends, recvs, deadline, fmt::format("the frames and blocks of collective #{}", mine.seq),
              afterStage);
}

}  // namespace ddp::gloo_backend
