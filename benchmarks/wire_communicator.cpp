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

using Transfer = LinkTransfer;

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

  // Everything but the reductions lands where it should.
  bool computes(CollectiveOp op) const override {
    return op != CollectiveOp::Allreduce && op != CollectiveOp::ReduceScatter;
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
      case CollectiveOp::Alltoall:
        return [this, &buffers] {
          alltoall(bytesOf(buffers.input), bytesOf(buffers.output), buffers.input.nbytes() / size_);
        };
      case CollectiveOp::Gather:
        return [this, &buffers] { gather(bytesOf(buffers.input), bytesOf(buffers.output), buffers.input.nbytes()); };
      case CollectiveOp::Scatter:
        return [this, &buffers] {
          scatter(bytesOf(buffers.input), bytesOf(buffers.output), buffers.output.nbytes());
        };
      case CollectiveOp::SendRecv:
        return [this, &buffers] {
          pingPong(bytesOf(buffers.input), bytesOf(buffers.output), buffers.input.nbytes());
        };
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

  // Block j of the input to rank j, block i of the output from rank i, all
  // pairs at once.
  void alltoall(uint8_t* input, uint8_t* output, size_t block) {
    std::memcpy(output + rank_ * block, input + rank_ * block, block);
    std::vector<Transfer> sends, recvs;
    for (int k = 1; k < size_; ++k) {
      const int to = mod(rank_ + k), from = mod(rank_ - k);
      sends.push_back({to, input + to * block, block});
      recvs.push_back({from, output + from * block, block});
    }
    move(sends, recvs, "alltoall");
  }

  void gather(uint8_t* input, uint8_t* output, size_t bytes) {  // root 0
    std::vector<Transfer> sends, recvs;
    if (rank_ == 0) {
      std::memcpy(output, input, bytes);
      for (int peer = 1; peer < size_; ++peer) recvs.push_back({peer, output + peer * bytes, bytes});
    } else {
      sends.push_back({0, input, bytes});
    }
    move(sends, recvs, "gather");
  }

  void scatter(uint8_t* input, uint8_t* output, size_t bytes) {  // root 0
    std::vector<Transfer> sends, recvs;
    if (rank_ == 0) {
      std::memcpy(output, input, bytes);
      for (int peer = 1; peer < size_; ++peer) sends.push_back({peer, input + peer * bytes, bytes});
    } else {
      recvs.push_back({0, output, bytes});
    }
    move(sends, recvs, "scatter");
  }

  // Rank 0 to the last rank and back; the ranks between idle.
  void pingPong(uint8_t* input, uint8_t* output, size_t bytes) {
    const int last = size_ - 1;
    std::vector<Transfer> none;
    if (rank_ == 0) {
      std::vector<Transfer> sends{{last, input, bytes}}, recvs{{last, output, bytes}};
      move(sends, none, "ping");
      move(none, recvs, "pong");
    } else if (rank_ == last) {
      std::vector<Transfer> recvs{{0, output, bytes}}, sends{{0, output, bytes}};
      move(none, recvs, "ping");
      move(sends, none, "pong");
    }
  }

  // Every transfer at once (framework/comm/links.hpp).
  void move(std::vector<Transfer>& sends, std::vector<Transfer>& recvs, const char* what) {
    try {
      transferAll(*links_, sends, recvs, Clock::now() + timeout_, what);
    } catch (const std::exception& e) {
      fail<BenchError>("tcp-wire rank {}: {}", rank_, e.what());
    }
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
