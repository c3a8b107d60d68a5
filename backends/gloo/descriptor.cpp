#include "backends/gloo/descriptor.hpp"

#include <cstring>

#include "framework/comm/process_group.hpp"
#include "framework/core/errors.hpp"

namespace ddp::gloo_backend {
namespace {

std::string describePeer(const Descriptor& d) {
  return fmt::format("{} #{} with {} elements, dtype code {}, root {}, op {}{}", opName(d.op), d.seq, d.numel,
                     d.dtype, d.root, reduceOpName(static_cast<ReduceOp>(d.reduceOp)),
                     d.sharedBuffer ? fmt::format(", in shared buffer #{}", d.sharedBuffer - 1) : std::string());
}

}  // namespace

const char* opName(uint32_t op) {
  switch (op) {
    case kAllreduce: return "allreduce";
    case kBroadcast: return "broadcast";
    case kAllgather: return "allgather";
    case kReduceScatter: return "reduce_scatter";
    case kBarrier: return "barrier";
    case kAlltoall: return "alltoall";
    case kGather: return "gather";
    case kScatter: return "scatter";
  }
  return "?";
}

std::string describeCall(int rank, int size, const Descriptor& d, const std::string& summary) {
  return fmt::format("[rank {}/{}] gloo {} #{} ({})", rank, size, opName(d.op), d.seq, summary);
}

void checkPeerDescriptor(int rank, int size, const Descriptor& mine, const Descriptor& theirs, int from) {
  if (std::memcmp(&theirs, &mine, sizeof(mine)) != 0) {
    fail<CollectiveError>(
        "{} does not match rank {}, which called {}. HINT: every rank must call the same collectives in the same "
        "order with the same dtype, element count and root",
        describeCall(rank, size, mine, describePeer(mine)), from, describePeer(theirs));
  }
}

}  // namespace ddp::gloo_backend
