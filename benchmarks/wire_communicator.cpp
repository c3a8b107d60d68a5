#include "benchmarks/wire_communicator.hpp"

#include <fmt/format.h>
#include <poll.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "benchmarks/bench_util.hpp"
#include "framework/comm/links.hpp"
#include "framework/core/errors.hpp"
#include "framework/store/tcp_store.hpp"

namespace ddp::bench {
namespace {

using Clock = std::chrono::steady_clock;

// One direction of one step: bytes to send to, or receive from, a peer.
struct Transfer {
  int peer;
  uint8_t* data;
  size_t bytes;
  size_t done = 0;
};

class WireCommunicator : public Communicator {
 public:
  explicit WireCommunicator(const Rendezvous& rendezvous)
      : rank_(rendezvous.rank), size_(rendezvous.worldSize), timeout_(rendezvous.timeout) {
    TCPStoreOptions storeOptions;
    storeOptions.host = benchMasterAddr();
    storeOptions.isServer = rank_ == 0;
    storeOptions.port = storeOptions.isServer ? 0 : awaitPort(rendezvous.portFile, timeout_, rank_);
    storeOptions.connectTimeout = timeout_;
    storeOptions.timeout = timeout_;
    store_ = std::make_shared<TCPStore>(storeOptions);
    if (storeOptions.isServer) publishPort(rendezvous.portFile, store_->port());
    // One connection between every pair of ranks.
    try {
      links_ = std::make_unique<Links>(*store_, "wire", Links::Shape::Mesh, rank_, size_, benchHostAddr(), timeout_);
    } catch (const std::exception& e) {
      fail<BenchError>("tcp-wire rank {}: connecting to the other ranks: {}", rank_, e.what());
    }
  }

  bool computes(CollectiveOp op) const override {
    return op == CollectiveOp::Allgather || op == CollectiveOp::Broadcast;
  }

  std::function<void()> bind(CollectiveOp op, Buffers& buffers) override {
    switch (op) {
      case CollectiveOp::Allreduce:
        return [this, &buffers] { ring(bytesOf(buffers.input), buffers.input.nbytes(), 2 * (size_ - 1)); };
      case CollectiveOp::ReduceScatter:
        return [this, &buffers] { ring(bytesOf(buffers.input), buffers.input.nbytes(), size_ - 1); };
      case CollectiveOp::Allgather:
        return [this, &buffers] { allgather(bytesOf(buffers.input), bytesOf(buffers.output), buffers.input.nbytes()); };
      case CollectiveOp::Broadcast:
        return [this, &buffers] { broadcast(bytesOf(buffers.input), buffers.input.nbytes()); };
    }
    throw BenchError("unknown collective");
  }

  void barrier() override {
    std::vector<uint8_t> out(size_, 1), in(size_, 0);
    std::vector<Transfer> sends, recvs;
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      sends.push_back({peer, &out[peer], 1});
      recvs.push_back({peer, &in[peer], 1});
    }
    move(sends, recvs, "barrier");
  }

 private:
  static uint8_t* bytesOf(const at::Tensor& t) { return static_cast<uint8_t*>(t.data_ptr()); }
  int mod(int b) const { return ((b % size_) + size_) % size_; }

  // The ring's steps over `bytes` at `data`, cut into one block per rank
  // (of whole float32 elements): at step s, block r-s goes right while
  // block r-s-1 comes in from the left, into scratch.
  void ring(uint8_t* data, size_t bytes, int steps) {
    const size_t count = bytes / sizeof(float);
    auto begin = [&](int b) { return static_cast<size_t>(b) * count / size_ * sizeof(float); };
    auto length = [&](int b) { return begin(b + 1) - begin(b); };
    if (scratch_.size() < length(size_ - 1) + sizeof(float)) scratch_.resize(length(size_ - 1) + sizeof(float));
    const int right = mod(rank_ + 1), left = mod(rank_ - 1);
    for (int s = 0; s < steps; ++s) {
      const int out = mod(rank_ - s), in = mod(rank_ - s - 1);
      std::vector<Transfer> sends{{right, data + begin(out), length(out)}};
      std::vector<Transfer> recvs{{left, scratch_.data(), length(in)}};
      move(sends, recvs, "ring step");
    }
  }

  void allgather(const uint8_t* input, uint8_t* output, size_t bytes) {
    std::memcpy(output + rank_ * bytes, input, bytes);
    const int right = mod(rank_ + 1), left = mod(rank_ - 1);
    for (int s = 0; s < size_ - 1; ++s) {
      std::vector<Transfer> sends{{right, output + mod(rank_ - s) * bytes, bytes}};
      std::vector<Transfer> recvs{{left, output + mod(rank_ - s - 1) * bytes, bytes}};
      move(sends, recvs, "allgather step");
    }
  }

  void broadcast(uint8_t* data, size_t bytes) {  // root 0, as the other implementations
    std::vector<Transfer> sends, recvs;
    if (rank_ == 0) {
      for (int peer = 1; peer < size_; ++peer) sends.push_back({peer, data, bytes});
    } else {
      recvs.push_back({0, data, bytes});
    }
    move(sends, recvs, "broadcast");
  }

  // Runs every transfer to completion at once: each is tried until the
  // kernel would block, then one poll() waits for any of them.
  void move(std::vector<Transfer>& sends, std::vector<Transfer>& recvs, const char* what) {
    const auto deadline = Clock::now() + timeout_;
    std::vector<pollfd> waiting;
    std::string why;
    // Moves each transfer of `list` until the kernel would block, then
    // waits for that socket to be ready for more.
    const auto advance = [&](std::vector<Transfer>& list, bool sending) {
      for (auto& t : list) {
        const int fd = sending ? links_->to(t.peer) : links_->from(t.peer);
        while (t.done < t.bytes) {
          const ssize_t n = sending ? sendSome(fd, t.data + t.done, t.bytes - t.done, &why)
                                    : recvSome(fd, t.data + t.done, t.bytes - t.done, &why);
          if (n < 0) lost(t.peer, what, why);
          if (n == 0) {
            waiting.push_back({fd, static_cast<short>(sending ? POLLOUT : POLLIN), 0});
            break;
          }
          t.done += static_cast<size_t>(n);
        }
      }
    };
    for (;;) {
      waiting.clear();
      advance(sends, /*sending=*/true);
      advance(recvs, /*sending=*/false);
      if (waiting.empty()) return;
      const int ready = pollUntil(waiting.data(), waiting.size(), deadline);
      if (ready == 0) {
        fail<BenchError>("tcp-wire rank {}: {} did not finish within {} ms", rank_, what, timeout_.count());
      }
      if (ready < 0 && errno != EINTR) fail<BenchError>("tcp-wire rank {}: poll: {}", rank_, std::strerror(errno));
    }
  }

  [[noreturn]] void lost(int peer, const char* what, const std::string& why) const {
    fail<BenchError>("tcp-wire rank {}: the connection to rank {} failed during a {}: {}", rank_, peer, what, why);
  }

  const int rank_, size_;
  const std::chrono::milliseconds timeout_;
  std::shared_ptr<TCPStore> store_;
  std::unique_ptr<Links> links_;  // after the store it met through
  std::vector<uint8_t> scratch_;
};

}  // namespace

std::unique_ptr<Communicator> makeWireCommunicator(const Rendezvous& rendezvous) {
  return std::make_unique<WireCommunicator>(rendezvous);
}

}  // namespace ddp::bench
