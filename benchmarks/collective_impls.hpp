// The implementations that `ddp-bench collectives` compares, behind one
// small interface: our backends (ddp::ProcessGroup from the registry) and
// LibTorch's own c10d::ProcessGroupGloo as the reference, where it builds.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddp::bench {

enum class CollectiveOp { Allreduce, Allgather, Broadcast, ReduceScatter, Alltoall, Gather, Scatter, SendRecv };
// Every operation, in the order the sweep runs them by default.
const std::vector<CollectiveOp>& allOps();

const char* opName(CollectiveOp op);  // "allreduce", "reduce_scatter", ...
std::optional<CollectiveOp> parseOp(const std::string& name);

// The name under which LibTorch's ProcessGroupGloo is benchmarked.
constexpr const char* kC10dGloo = "c10d-gloo";
// Whether this build has kC10dGloo: only where LibTorch's c10d Gloo header
// compiled and linked when CMake ran. If not, `whyNot` says why.
bool c10dGlooBuilt(std::string* whyNot = nullptr);
// Our gloo backend with its same-host shared-memory path turned off: the
// path that ranks on different hosts take.
constexpr const char* kGlooTcp = "gloo-tcp";
// Plain sockets moving the bytes of each operation and nothing else: the
// ceiling of any TCP implementation (benchmarks/wire_communicator.hpp).
// Run only when --impls names it.
constexpr const char* kTcpWire = "tcp-wire";

// Thrown by a bound collective when the implementation lacks the operation.
// Every rank throws it at the same call, before any data moves, so the
// ranks can skip the operation together.
class UnsupportedOp : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The tensors of one (operation, size) point. Allreduce and broadcast work
// in place on `input`; allgather and gather write `output` (world x
// input; gather only on root 0); reduce_scatter and scatter read `input`
// (world x output; scatter only on root 0); alltoall sends block j of
// `input` to rank j and receives rank i's block into block i of `output`
// (equal splits). SendRecv is a ping-pong between rank 0 and the last rank:
// rank 0 sends `input`, the last rank receives it into `output` and sends
// it back, and rank 0 receives it into `output`; the ranks between idle.
struct Buffers {
  at::Tensor input;
  at::Tensor output;
};

// How ranks of one implementation meet: rank 0 serves a TCP store on a free
// port of 127.0.0.1 and publishes the port in `portFile`, which the others
// poll (no port race, unlike picking a free port in the launcher).
struct Rendezvous {
  int rank = 0;
  int worldSize = 1;
  std::string portFile;
  std::chrono::milliseconds timeout{120000};  // store and collectives
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  // Returns a callable that runs `op` on `buffers` once and waits for it
  // (sum for reductions, root 0 for broadcast). Everything that does not
  // belong to the collective itself (argument vectors, views) is prepared
  // here, outside the timed calls. `buffers` must outlive the callable.
  virtual std::function<void()> bind(CollectiveOp op, Buffers& buffers) = 0;

  virtual void barrier() = 0;

  // Whether `op` leaves the operation's result (false: it only moves the
  // bytes, and --verify skips it).
  virtual bool computes(CollectiveOp) const { return true; }
};

// `impl` is a backend name from ddp::builtinBackends(), kGlooTcp, kTcpWire
// or kC10dGloo (BenchError when c10dGlooBuilt() is false).
std::unique_ptr<Communicator> makeCommunicator(const std::string& impl, const Rendezvous& rendezvous);

}  // namespace ddp::bench
