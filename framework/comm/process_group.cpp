#include "framework/comm/process_group.hpp"

#include <ATen/ATen.h>
#include <c10/core/ScalarType.h>

#include "framework/core/errors.hpp"

namespace ddp {

const char* reduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Min: return "min";
    case ReduceOp::Max: return "max";
    case ReduceOp::Product: return "product";
  }
  return "?";
}

ProcessGroup::ProcessGroup(int rank, int size, ProcessGroupOptions options)
    : rank_(rank), size_(size), options_(std::move(options)) {
  if (size < 1 || rank < 0 || rank >= size) {
    fail<UsageError>("process group: rank {} is outside world size {}. HINT: RANK must be in [0, WORLD_SIZE)", rank,
                     size);
  }
}

at::Tensor ProcessGroup::allocateCommunicationBuffer(int64_t numel, const at::TensorOptions& options) {
  return at::zeros({numel}, options);
}

void ProcessGroup::notSupported(const std::string& operation) const {
  fail<NotSupportedError>("backend '{}' does not support {}", backendName(), operation);
}

WorkPtr ProcessGroup::allreduce(at::Tensor&, const AllreduceOptions&) { notSupported("allreduce"); }
WorkPtr ProcessGroup::broadcast(at::Tensor&, const BroadcastOptions&) { notSupported("broadcast"); }
WorkPtr ProcessGroup::allgather(const at::Tensor&, at::Tensor&, const AllgatherOptions&) {
  notSupported("allgather");
}
WorkPtr ProcessGroup::reduceScatter(const at::Tensor&, at::Tensor&, const ReduceScatterOptions&) {
  notSupported("reduce_scatter");
}
WorkPtr ProcessGroup::barrier(const BarrierOptions&) { notSupported("barrier"); }
WorkPtr ProcessGroup::send(const at::Tensor&, int, const SendOptions&) { notSupported("send"); }
WorkPtr ProcessGroup::recv(at::Tensor&, int, const RecvOptions&) { notSupported("recv"); }

std::string dtypeName(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    case at::kInt: return "int32";
    case at::kLong: return "int64";
    default: return c10::toString(t.scalar_type());
  }
}

}  // namespace ddp
