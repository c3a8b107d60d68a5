// RingLinks: the two TCP connections of a rank's place in the ring, its
// own sockets beside Gloo's pairs.
//
// Rank r connects to its right neighbour (r + 1) % n and accepts one
// connection from its left; at two ranks these are two connections between
// the same pair, one per direction. Ranks meet through the group's store:
// each publishes "ring/<rank>" = its port, a random nonce and its address
// (the one Gloo's device listens on), and a connecting rank proves itself
// with its rank and the acceptor's nonce. Anything else that connects is
// dropped, and accepting goes on until the deadline.
//
// The ring moves its blocks over these with non-blocking I/O in the
// calling thread (backends/gloo/ring.hpp): no transport thread hands the
// bytes over, and no "ready to receive" message precedes them. interrupt()
// shuts both connections down from any thread, so that a ring waiting in
// poll() on either side fails at once (ProcessGroupGloo::abort).
#pragma once

#include <chrono>
#include <memory>
#include <string>

namespace ddp {
class Store;
}

namespace ddp::gloo_backend {

class RingLinks {
 public:
  // Connects (size > 1). `address` is the IP to listen on; throws
  // std::runtime_error naming the neighbour that did not connect, or what
  // failed, by `timeout`.
  RingLinks(Store& store, int rank, int size, const std::string& address, std::chrono::milliseconds timeout);
  ~RingLinks();
  RingLinks(const RingLinks&) = delete;
  RingLinks& operator=(const RingLinks&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int right() const { return (rank_ + 1) % size_; }
  int left() const { return (rank_ + size_ - 1) % size_; }
  int toRight() const { return toRight_; }    // send only; non-blocking
  int fromLeft() const { return fromLeft_; }  // receive only; non-blocking
  void interrupt();

 private:
  const int rank_, size_;
  int toRight_ = -1, fromLeft_ = -1;
};

}  // namespace ddp::gloo_backend
