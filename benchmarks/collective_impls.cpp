// Whether LibTorch's c10d ProcessGroupGloo builds here: CMake found out
// (benchmarks/CMakeLists.txt).
#include "backends/builtin.hpp"
#include "ddp/c10d_gloo.hpp"

#if DDP_HAVE_C10D_GLOO
// LibTorch's c10d ProcessGroupGloo header is empty unless this is defined.
// Torch's CMake config usually passes -DUSE_C10D_GLOO; do not rely on it.
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO 1
#endif
#endif

#include "benchmarks/collective_impls.hpp"

#include <fmt/format.h>
#if DDP_HAVE_C10D_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#endif

#include <filesystem>
#include <fstream>
#include <thread>

#include "benchmarks/bench_util.hpp"
#include "benchmarks/wire_communicator.hpp"
#include "framework/comm/backend_registry.hpp"
#include "framework/core/errors.hpp"
#include "framework/store/tcp_store.hpp"

namespace ddp::bench {

const char* opName(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::Allreduce: return "allreduce";
    case CollectiveOp::Allgather: return "allgather";
    case CollectiveOp::Broadcast: return "broadcast";
    case CollectiveOp::ReduceScatter: return "reduce_scatter";
    case CollectiveOp::Alltoall: return "alltoall";
    case CollectiveOp::Gather: return "gather";
    case CollectiveOp::Scatter: return "scatter";
    case CollectiveOp::SendRecv: return "sendrecv";
  }
  return "?";
}

const std::vector<CollectiveOp>& allOps() {
  static const std::vector<CollectiveOp> ops = {
      CollectiveOp::Allreduce, CollectiveOp::Allgather, CollectiveOp::Broadcast, CollectiveOp::ReduceScatter,
      CollectiveOp::Alltoall,  CollectiveOp::Gather,    CollectiveOp::Scatter,   CollectiveOp::SendRecv};
  return ops;
}

std::optional<CollectiveOp> parseOp(const std::string& name) {
  for (auto op : allOps()) {
    if (name == opName(op)) return op;
  }
  return std::nullopt;
}

namespace {


#if DDP_HAVE_C10D_GLOO
// The chunks of a flat tensor that belong to each rank.
std::vector<at::Tensor> chunksOf(const at::Tensor& flat, int worldSize) {
  const int64_t chunk = flat.numel() / worldSize;
  std::vector<at::Tensor> chunks;
  for (int r = 0; r < worldSize; ++r) chunks.push_back(flat.narrow(0, r * chunk, chunk));
  return chunks;
}
#endif

// ---- our backends -------------------------------------------------------------

class DdpCommunicator : public Communicator {
 public:
  DdpCommunicator(const std::string& backend, const Rendezvous& rendezvous, bool sharedMemory = true) {
    TCPStoreOptions storeOptions;
    storeOptions.host = benchMasterAddr();
    storeOptions.isServer = rendezvous.rank == 0;
    storeOptions.port = storeOptions.isServer ? 0 : awaitPort(rendezvous.portFile, rendezvous.timeout, rendezvous.rank);
    storeOptions.connectTimeout = rendezvous.timeout;
    storeOptions.timeout = rendezvous.timeout;
    auto store = std::make_shared<TCPStore>(storeOptions);
    if (storeOptions.isServer) publishPort(rendezvous.portFile, store->port());

    ProcessGroupOptions groupOptions;
    groupOptions.timeout = rendezvous.timeout;
    groupOptions.masterAddr = benchMasterAddr();
    groupOptions.sharedMemory = sharedMemory;
    group_ = builtinBackends().create(backend, store, rendezvous.rank, rendezvous.worldSize, groupOptions);
    store_ = std::move(store);
  }

  std::function<void()> bind(CollectiveOp op, Buffers& buffers) override {
    ProcessGroup& group = *group_;
    switch (op) {
      case CollectiveOp::Allreduce:
        return [&group, &buffers] { start([&] { return group.allreduce(buffers.input); })->wait(); };
      case CollectiveOp::Broadcast:
        return [&group, &buffers] { start([&] { return group.broadcast(buffers.input); })->wait(); };
      case CollectiveOp::Allgather:
        return [&group, &buffers] {
          start([&] { return group.allgather(buffers.input, buffers.output); })->wait();
        };
      case CollectiveOp::ReduceScatter:
        return [&group, &buffers] {
          start([&] { return group.reduceScatter(buffers.input, buffers.output); })->wait();
        };
      case CollectiveOp::Alltoall:
        return [&group, &buffers] {
          start([&] { return group.alltoall(buffers.input, buffers.output); })->wait();
        };
      case CollectiveOp::Gather:
        return [&group, &buffers] { start([&] { return group.gather(buffers.input, buffers.output); })->wait(); };
      case CollectiveOp::Scatter:
        return [&group, &buffers] { start([&] { return group.scatter(buffers.input, buffers.output); })->wait(); };
      case CollectiveOp::SendRecv: {
        const int last = group.size() - 1;
        if (group.rank() == 0) {
          return [&group, &buffers, last] {
            WorkPtr sent = start([&] { return group.send(buffers.input, last); });
            WorkPtr received = start([&] { return group.recv(buffers.output, last); });
            sent->wait();
            received->wait();
          };
        }
        if (group.rank() == last) {
          return [&group, &buffers] {
            start([&] { return group.recv(buffers.output, 0); })->wait();
            start([&] { return group.send(buffers.output, 0); })->wait();
          };
        }
        return [] {};
      }
    }
    throw BenchError("unknown collective");
  }

  void barrier() override { group_->barrier()->wait(); }

 private:
  // A backend without the operation throws NotSupportedError at the call.
  template <typename Call>
  static WorkPtr start(Call call) {
    try {
      return call();
    } catch (const NotSupportedError& e) {
      throw UnsupportedOp(e.what());
    }
  }

  std::shared_ptr<Store> store_;
  ProcessGroupPtr group_;  // declared last: destroyed before the store it uses
};

// ---- the reference: LibTorch's c10d::ProcessGroupGloo ------------------------

#if DDP_HAVE_C10D_GLOO
class C10dGlooCommunicator : public Communicator {
 public:
  explicit C10dGlooCommunicator(const Rendezvous& rendezvous)
      : rank_(rendezvous.rank), worldSize_(rendezvous.worldSize) {
    c10d::TCPStoreOptions storeOptions;
    storeOptions.isServer = rendezvous.rank == 0;
    storeOptions.port = storeOptions.isServer ? 0 : awaitPort(rendezvous.portFile, rendezvous.timeout, rendezvous.rank);
    storeOptions.numWorkers = rendezvous.worldSize;
    // Rank 0 publishes the port only after its constructor returns, so it
    // must not wait there for the others to connect.
    storeOptions.waitWorkers = false;
    storeOptions.timeout = rendezvous.timeout;
    auto store = c10::make_intrusive<c10d::TCPStore>(benchMasterAddr(), storeOptions);
    if (storeOptions.isServer) publishPort(rendezvous.portFile, store->getPort());
    store_ = store;

    auto options = c10d::ProcessGroupGloo::Options::create(rendezvous.timeout);
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(benchHostAddr()));
    group_ = c10::make_intrusive<c10d::ProcessGroupGloo>(store_, rendezvous.rank, rendezvous.worldSize, options);
  }

  std::function<void()> bind(CollectiveOp op, Buffers& buffers) override {
    c10d::ProcessGroupGloo& group = *group_;
    // c10d takes vectors of tensors; they are built once here.
    switch (op) {
      case CollectiveOp::Allreduce: {
        std::vector<at::Tensor> tensors{buffers.input};
        return [&group, tensors]() mutable { start([&] { return group.allreduce(tensors); })->wait(); };
      }
      case CollectiveOp::Broadcast: {
        std::vector<at::Tensor> tensors{buffers.input};
        c10d::BroadcastOptions options;
        options.rootRank = 0;
        return [&group, tensors, options]() mutable {
          start([&] { return group.broadcast(tensors, options); })->wait();
        };
      }
      case CollectiveOp::Allgather: {
        // Views of our flat output, so the result lands where ours does;
        // _allgather_base (flat output) is not supported by c10d's Gloo.
        std::vector<std::vector<at::Tensor>> outputs{chunksOf(buffers.output, worldSize_)};
        std::vector<at::Tensor> inputs{buffers.input};
        return [&group, outputs, inputs]() mutable {
          start([&] { return group.allgather(outputs, inputs); })->wait();
        };
      }
      case CollectiveOp::ReduceScatter: {
        std::vector<at::Tensor> outputs{buffers.output};
        std::vector<std::vector<at::Tensor>> inputs{chunksOf(buffers.input, worldSize_)};
        return [&group, outputs, inputs]() mutable {
          start([&] { return group.reduce_scatter(outputs, inputs); })->wait();
        };
      }
      case CollectiveOp::Alltoall: {
        // Equal splits, given as empty split lists (as ours).
        std::vector<int64_t> outputSplits, inputSplits;
        at::Tensor output = buffers.output, input = buffers.input;
        return [&group, output, input, outputSplits, inputSplits]() mutable {
          start([&] { return group.alltoall_base(output, input, outputSplits, inputSplits); })->wait();
        };
      }
      case CollectiveOp::Gather: {
        // Only the root passes output tensors (c10d refuses them elsewhere).
        std::vector<std::vector<at::Tensor>> outputs;
        if (rank_ == 0) outputs.push_back(chunksOf(buffers.output, worldSize_));
        std::vector<at::Tensor> inputs{buffers.input};
        return [&group, outputs, inputs]() mutable {
          start([&] { return group.gather(outputs, inputs); })->wait();
        };
      }
      case CollectiveOp::Scatter: {
        std::vector<std::vector<at::Tensor>> inputs;
        if (rank_ == 0) inputs.push_back(chunksOf(buffers.input, worldSize_));
        std::vector<at::Tensor> outputs{buffers.output};
        return [&group, outputs, inputs]() mutable {
          start([&] { return group.scatter(outputs, inputs); })->wait();
        };
      }
      case CollectiveOp::SendRecv: {
        const int last = worldSize_ - 1;
        std::vector<at::Tensor> input{buffers.input}, output{buffers.output};
        if (rank_ == 0) {
          return [&group, input, output, last]() mutable {
            auto sent = start([&] { return group.send(input, last, 0); });
            auto received = start([&] { return group.recv(output, last, 0); });
            sent->wait();
            received->wait();
          };
        }
        if (rank_ == last) {
          return [&group, output]() mutable {
            start([&] { return group.recv(output, 0, 0); })->wait();
            start([&] { return group.send(output, 0, 0); })->wait();
          };
        }
        return [] {};
      }
    }
    throw BenchError("unknown collective");
  }

  void barrier() override { group_->barrier()->wait(); }

 private:
  // c10d's base ProcessGroup rejects an operation the backend lacks with
  // "... does not support <op>" at the call (LibTorch 1.13's Gloo:
  // reduce_scatter). Any other error is a real failure.
  template <typename Call>
  static c10::intrusive_ptr<c10d::Work> start(Call call) {
    try {
      return call();
    } catch (const c10::Error& e) {
      const std::string message = e.what_without_backtrace();
      if (message.find("does not support") != std::string::npos) throw UnsupportedOp(message);
      throw;
    }
  }

  const int rank_, worldSize_;
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group_;  // last: destroyed before the store
};
#endif  // DDP_HAVE_C10D_GLOO

}  // namespace

bool c10dGlooBuilt(std::string* whyNot) {
  if (whyNot) *whyNot = DDP_HAVE_C10D_GLOO ? "" : DDP_C10D_GLOO_STATUS;
  return DDP_HAVE_C10D_GLOO;
}

std::unique_ptr<Communicator> makeCommunicator(const std::string& impl, const Rendezvous& rendezvous) {
  if (impl == kC10dGloo) {
#if DDP_HAVE_C10D_GLOO
    return std::make_unique<C10dGlooCommunicator>(rendezvous);
#else
    fail<BenchError>("{} is not in this build: {}", kC10dGloo, DDP_C10D_GLOO_STATUS);
#endif
  }
  if (impl == kTcpWire) return makeWireCommunicator(rendezvous);
  if (impl == kGlooTcp) return std::make_unique<DdpCommunicator>("gloo", rendezvous, /*sharedMemory=*/false);
  return std::make_unique<DdpCommunicator>(impl, rendezvous);
}

}  // namespace ddp::bench
