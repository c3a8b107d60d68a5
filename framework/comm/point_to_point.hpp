// PointToPoint: send and recv between two ranks of a group, over TCP
// connections of its own, for backends whose collectives do not carry them
// (gloo's shared memory and ring).
//
// Contract
// - Nothing happens until a rank's first send or recv: it then listens on
//   `address` (port 0) and publishes "p2p/<rank>" = port, nonce, address in
//   the group's store, and starts one I/O thread. A sender connects to the
//   receiver (waiting for its address up to the send's timeout) and proves
//   itself with the receiver's nonce; anything else that connects is
//   dropped. Data flows from the connecting side only: rank a's sends to b
//   and b's sends to a use two connections.
// - send(tensor, dst, tag) reads the tensor (a contiguous CPU one in place;
//   others through a copy made at the call) until its Work completes, when
//   the bytes are in the kernel's hands: as for every collective, leave it
//   unmodified until then. What the kernel takes at once goes from the
//   calling thread (all of a small message), the rest from the I/O thread. recv(tensor, src, tag) completes when a message
//   from src (kAnySourceRank: any rank) with that tag has filled the tensor;
//   work->sourceRank() then names the sender. Messages of one sender arrive in
//   the order sent; a recv takes the first match, so tags may be received
//   in any order (earlier messages of other tags are kept until a recv
//   asks for them).
// - A message whose dtype or element count differs from the recv's fails
//   that recv, naming both. A Work that does not finish within its timeout
//   fails with CollectiveError naming rank, operation, peer, tag and
//   timeout. A peer that closes its connection (it died) fails the recvs
//   waiting on it at once, naming it; recvs from any source wait on.
// - shutdown() (and the destructor) fails what is still pending, closes the
//   connections and joins the threads; the object stays usable, failing
//   every later call, so a collective still queued on it cannot crash.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "framework/comm/process_group.hpp"
#include "framework/comm/work.hpp"

namespace ddp {

class Store;

class PointToPoint {
 public:
  // `label` starts every error, e.g. "[rank 1/4] gloo".
  PointToPoint(std::shared_ptr<Store> store, int rank, int size, std::string address, std::string label);
  ~PointToPoint();
  PointToPoint(const PointToPoint&) = delete;
  PointToPoint& operator=(const PointToPoint&) = delete;

  WorkPtr send(const at::Tensor& tensor, int dst, int tag, std::chrono::milliseconds timeout);
  // The Work's sourceRank() names the sender once it has finished.
  WorkPtr recv(at::Tensor& tensor, int src, int tag, std::chrono::milliseconds timeout);
  // Closes every connection and fails what is pending; later sends and
  // recvs fail at once. The destructor does it too. Any thread.
  void shutdown();
  // Called with the error (and whether it is a timeout), on the I/O thread
  // (or the caller's), before a send or recv fails (not for shutdown()): a
  // group breaks itself there, so that a waiter that sees the failure finds
  // the group broken. It must not call into this object.
  void setFailureHook(std::function<void(const std::string& why, bool timedOut)> hook);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A collective built on point to point (alltoall, gather, scatter where a
// backend has no better path): every rank sends sends[j] to rank j and
// receives recvs[i] from rank i, all at once, staggered (rank r first talks
// to r + 1), and waits for all of them by `deadline`. Undefined tensors
// (and this rank's own) are skipped; an empty one is still a message, so
// that a receiver that expects another count fails. Every message carries
// `tag` (negative: internal, one per collective). Once all have ended, the
// first failure throws CollectiveError "<label>: the block from rank i (N
// elements expected): <why>" (or "the block to rank j").
void exchangeBlocks(PointToPoint& p2p, int rank, int size, const std::vector<at::Tensor>& sends,
                    const std::vector<at::Tensor>& recvs, int tag, std::chrono::steady_clock::time_point deadline,
                    const std::string& label);

}  // namespace ddp
