// Descriptor: what one queued Gloo collective is (sequence number,
// operation, dtype, element count, root, reduce op, shared buffer). Each
// rank sends its own to its peers (in a frame, or through shared memory)
// and checks theirs against it: ranks that disagree fail with a
// CollectiveError before any payload moves. The struct is compared with
// memcmp, so it has no padding.
#pragma once

#include <cstdint>
#include <string>

#include "framework/core/errors.hpp"

namespace ddp::gloo_backend {

enum OpCode : uint32_t { kAllreduce = 1, kBroadcast, kAllgather, kReduceScatter, kBarrier, kAlltoall, kGather, kScatter };

struct Descriptor {
  uint64_t seq = 0;
  uint32_t op = 0;  // OpCode
  uint32_t dtype = 0;
  int64_t numel = 0;
  int32_t root = 0;
  int32_t reduceOp = 0;
  uint32_t sharedBuffer = 0;  // allreduce in place in ShmBuffer id - 1; 0: none
  uint32_t reserved = 0;      // keeps the struct free of padding (it is memcmp'd)
};

const char* opName(uint32_t op);

// "[rank 1/4] gloo allreduce #7 (1000 elements, float32, sum)": the start of
// every message about one collective.
std::string describeCall(int rank, int size, const Descriptor& d, const std::string& summary);

// A failure that every rank detects by itself from the same facts
// (alltoall's splits, which every rank reads before it reads any row): the
// worker does not reset its connections after it (as after other
// failures, to end the peers' waits), so that each rank reports the facts
// rather than a reset by the first rank to fail.
class AgreedFailure : public CollectiveError {
 public:
  using CollectiveError::CollectiveError;
};

// Throws CollectiveError naming both calls when `theirs` (from rank `from`)
// differs from `mine`.
void checkPeerDescriptor(int rank, int size, const Descriptor& mine, const Descriptor& theirs, int from);

}  // namespace ddp::gloo_backend
