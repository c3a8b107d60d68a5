// Links: a rank's own TCP connections to its peers: the gloo backend's TCP
// collectives run over them (backends/gloo/frames.hpp, ring.hpp), and so
// does ddp-bench's tcp-wire (benchmarks/wire_communicator.hpp).
//
// Two shapes:
// - Ring: a connection to the right neighbour (rank + 1) % n, used only to
//   send, and one from the left, used only to receive. At two ranks these
//   are two connections between the same pair, one per direction.
// - Mesh: one connection between every pair of ranks, both directions.
// Ranks meet through the group's store: each publishes "<name>/<rank>" =
// its port, a random nonce and its address (the one Gloo's device listens
// on), connects to the peers it must (the right; or every lower rank) and
// accepts the others, each of which proves itself with its rank and the
// acceptor's nonce. Anything else that connects is dropped, and accepting
// goes on until the deadline.
//
// Every socket is non-blocking; the users do their own I/O, with
// sendSome(), recvSome() and pollUntil() below.
// interrupt() shuts every connection down, from any thread, so that a
// collective waiting on either side fails at once (ProcessGroupGloo::abort);
// interrupted() then tells the waiting side why its connection broke.
#pragma once

#include <poll.h>
#include <sys/uio.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace ddp {

class Store;

class Links {
 public:
  enum class Shape { Ring, Mesh };

  // Connects (size > 1) by `timeout`; throws std::runtime_error naming the
  // peer that did not connect, or what failed. `address` is the IP to
  // listen on.
  Links(Store& store, const std::string& name, Shape shape, int rank, int size, const std::string& address,
        std::chrono::milliseconds timeout);
  ~Links();
  Links(const Links&) = delete;
  Links& operator=(const Links&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int right() const { return (rank_ + 1) % size_; }
  int left() const { return (rank_ + size_ - 1) % size_; }
  // The socket that carries bytes to / from `peer`; -1 where this shape
  // has none (a ring sends only to the right, receives only from the left).
  int to(int peer) const { return to_[static_cast<size_t>(peer)]; }
  int from(int peer) const { return from_[static_cast<size_t>(peer)]; }

  void interrupt();
  bool interrupted() const { return interrupted_.load(); }
  // Only from the thread that does the I/O, when nothing else uses the
  // sockets: interrupt(), then close every connection with a reset, so that
  // a peer still sending to this rank fails at once too (after a mere
  // shutdown its bytes would be taken until the buffers fill, and it would
  // wait for its timeout).
  void reset();

 private:
  void closeAll();

  const int rank_, size_;
  // By peer rank; a mesh holds the same socket in both. Changed only under
  // mutex_ after the constructor (interrupt() may run on another thread).
  std::vector<int> to_, from_;
  std::atomic<bool> interrupted_{false};
  std::mutex mutex_;
};

// One non-blocking send (recv) on a connection, retried on EINTR: the bytes
// moved (> 0), 0 when the kernel would block, or -1 when the connection
// failed or (recv) was closed, with *why saying how.
ssize_t sendSome(int fd, const void* data, size_t bytes, std::string* why);
// The same for `count` parts sent as one (sendmsg): a header and its
// payload without copying them together.
ssize_t sendSomeParts(int fd, const iovec* parts, int count, std::string* why);
ssize_t recvSome(int fd, void* data, size_t bytes, std::string* why);

// poll() on `fds` until `deadline`: 0 once it has passed (without calling
// poll), else poll()'s own result (-1 with errno, e.g. EINTR).
int pollUntil(pollfd* fds, size_t count, std::chrono::steady_clock::time_point deadline);

// One direction of a transfer between this rank and `peer`: `bytes` at
// `data` to send over links.to(peer), or to receive from links.from(peer).
struct LinkTransfer {
  int peer = -1;
  void* data = nullptr;
  size_t bytes = 0;
  int stage = 0;  // receives only: see transferAll
  size_t done = 0;
};

// Runs every transfer of `sends` and `recvs` to completion at once, from
// this thread: each moves until the kernel would block, then one poll()
// waits for any of them.
// - Transfers on one connection run in list order (a stream's bytes follow
//   each other); zero-byte transfers are done at once.
// - Receives are staged: those of stage s + 1 start once every receive of
//   stages up to s is done and afterStage(s) has returned (when given; it
//   may throw, e.g. to refuse what a header said, or append receives of
//   later stages, or sends). Sends are not staged: they move from the
//   moment they are in the list.
// Throws std::runtime_error "the connection to rank P failed (<what>): <why>"
// (or "interrupted" after interrupt()): at once for a receive; for a send,
// once the receives have run their course (a peer that closed after
// finding a mistake is then reported by what it sent, the mistake, rather
// than by its reset). At the deadline: "rank P did not
// send its bytes of <what> before the timeout (D of N received)" naming
// the first peer still owing bytes (or still to take ours).
void transferAll(Links& links, std::vector<LinkTransfer>& sends, std::vector<LinkTransfer>& recvs,
                 std::chrono::steady_clock::time_point deadline, const std::string& what,
                 const std::function<void(int stage)>& afterStage = {});

}  // namespace ddp
