#include "benchmarks/wire_communicator.hpp"

#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "benchmarks/bench_util.hpp"
#include "framework/core/errors.hpp"
#include "framework/store/tcp/socket.hpp"
#include "framework/store/tcp_store.hpp"

namespace ddp::bench {
namespace {

using tcpstore::Clock;

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
      : rank_(rendezvous.rank), size_(rendezvous.worldSize), timeout_(rendezvous.timeout), fds_(size_, -1) {
    TCPStoreOptions storeOptions;
    storeOptions.host = benchMasterAddr();
    storeOptions.isServer = rank_ == 0;
    storeOptions.port = storeOptions.isServer ? 0 : awaitPort(rendezvous.portFile, timeout_, rank_);
    storeOptions.connectTimeout = timeout_;
    storeOptions.timeout = timeout_;
    store_ = std::make_shared<TCPStore>(storeOptions);
    if (storeOptions.isServer) publishPort(rendezvous.portFile, store_->port());
    try {
      connectMesh();
    } catch (const tcpstore::IoTimeout&) {
      fail<BenchError>("tcp-wire rank {}: connecting to the other ranks took longer than {} ms", rank_,
                       timeout_.count());
    } catch (const tcpstore::ConnectionLost& e) {
      fail<BenchError>("tcp-wire rank {}: a connection broke while the ranks met: {}", rank_, e.reason);
    }
  }

  ~WireCommunicator() override {
    for (int fd : fds_) tcpstore::closeFd(fd);
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

  // Every pair of ranks gets one connection: rank r connects to the ranks
  // below it and accepts the ones above, each of which says who it is.
  void connectMesh() {
    const auto deadline = Clock::now() + timeout_;
    tcpstore::AddrInfoList here;
    const std::string host = benchHostAddr();
    std::string error = tcpstore::resolve(host, 0, /*passive=*/true, &here);
    if (!error.empty()) fail<BenchError>("tcp-wire rank {}: cannot resolve {}: {}", rank_, host, error);
    int err = 0;
    const int listener = tcpstore::listenOn(*here.list, &err);
    if (listener < 0) fail<BenchError>("tcp-wire rank {}: cannot listen on {}: {}", rank_, host, std::strerror(err));
    store_->setString(fmt::format("wire/{}", rank_), std::to_string(tcpstore::boundPort(listener)) + " " + host);

    for (int peer = 0; peer < rank_; ++peer) {
      const std::string value = store_->getString(fmt::format("wire/{}", peer));
      const auto space = value.find(' ');
      const auto port = static_cast<uint16_t>(std::stoi(value.substr(0, space)));
      const std::string peerHost = value.substr(space + 1);
      tcpstore::AddrInfoList there;
      error = tcpstore::resolve(peerHost, port, /*passive=*/false, &there);
      if (error.empty()) {
        fds_[peer] = tcpstore::connectTo(*there.list, deadline, &error);
      }
      if (fds_[peer] < 0) {
        fail<BenchError>("tcp-wire rank {}: cannot connect to rank {} at {}: {}", rank_, peer,
                         tcpstore::formatHostPort(peerHost, port), error);
      }
      const int32_t me = rank_;
      tcpstore::sendAll(fds_[peer], std::string(reinterpret_cast<const char*>(&me), sizeof me), deadline);
    }
    for (int accepted = rank_ + 1; accepted < size_; ++accepted) {
      if (!tcpstore::waitReady(listener, POLLIN, deadline)) throw tcpstore::IoTimeout{};
      const int fd = ::accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) fail<BenchError>("tcp-wire rank {}: accept: {}", rank_, std::strerror(errno));
      int32_t peer = -1;
      tcpstore::recvAll(fd, reinterpret_cast<char*>(&peer), sizeof peer, deadline);
      if (peer <= rank_ || peer >= size_ || fds_[peer] >= 0) {
        fail<BenchError>("tcp-wire rank {}: a connection claimed to be rank {}", rank_, peer);
      }
      tcpstore::setNoDelay(fd);
      fds_[peer] = fd;
    }
    tcpstore::closeFd(listener);
  }

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
    for (;;) {
      waiting.clear();
      for (auto& t : sends) {
        while (t.done < t.bytes) {
          const ssize_t n = ::send(fds_[t.peer], t.data + t.done, t.bytes - t.done, MSG_NOSIGNAL);
          if (n > 0) {
            t.done += static_cast<size_t>(n);
          } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
            if (errno == EAGAIN) {
              waiting.push_back({fds_[t.peer], POLLOUT, 0});
              break;
            }
          } else {
            lost(t.peer, what, std::strerror(errno));
          }
        }
      }
      for (auto& t : recvs) {
        while (t.done < t.bytes) {
          const ssize_t n = ::recv(fds_[t.peer], t.data + t.done, t.bytes - t.done, 0);
          if (n > 0) {
            t.done += static_cast<size_t>(n);
          } else if (n == 0) {
            lost(t.peer, what, "the connection was closed");
          } else if (errno == EAGAIN) {
            waiting.push_back({fds_[t.peer], POLLIN, 0});
            break;
          } else if (errno != EINTR) {
            lost(t.peer, what, std::strerror(errno));
          }
        }
      }
      if (waiting.empty()) return;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) {
        fail<BenchError>("tcp-wire rank {}: {} did not finish within {} ms", rank_, what, timeout_.count());
      }
      if (::poll(waiting.data(), waiting.size(), static_cast<int>(left)) < 0 && errno != EINTR) {
        fail<BenchError>("tcp-wire rank {}: poll: {}", rank_, std::strerror(errno));
      }
    }
  }

  [[noreturn]] void lost(int peer, const char* what, const char* why) const {
    fail<BenchError>("tcp-wire rank {}: the connection to rank {} failed during a {}: {}", rank_, peer, what, why);
  }

  const int rank_, size_;
  const std::chrono::milliseconds timeout_;
  std::shared_ptr<TCPStore> store_;
  std::vector<int> fds_;  // by peer rank; -1 for this rank
  std::vector<uint8_t> scratch_;
};

}  // namespace

std::unique_ptr<Communicator> makeWireCommunicator(const Rendezvous& rendezvous) {
  return std::make_unique<WireCommunicator>(rendezvous);
}

}  // namespace ddp::bench
