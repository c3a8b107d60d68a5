// Blocks: one block per ordered pair of ranks, moved straight from the
// sender's input to the receiver's output: what alltoall, gather and
// scatter share. A plan says, by rank, which elements of this rank's flat
// host input go where and where the peers' land; counts may be 0.
//
// The path (blockPath):
// - Local: one rank; its own block is copied.
// - Shm: rounds through the shared slots, a share of the slot per pair.
// - Frame (TCP, up to FrameExchange::kAllToAllMaxRanks ranks): a frame to
//   every rank (descriptor, and the plan's table if any), the blocks right
//   behind it over the same mesh of connections, all pairs at once.
// - PointToPoint (TCP, more ranks, where the frames form a ring): a
//   message per pair (framework/comm/point_to_point.hpp), tagged by the
//   collective's sequence number; a receiver whose count differs from the
//   sender's fails naming both. Descriptors are not checked on this path.
// On Shm and Frame every rank checks every peer's descriptor, and, when the
// plan has a table (alltoall's splits), every rank's table, before it
// reads any block (over TCP the blocks follow the frames at once), so that
// ranks that disagree fail alike.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backends/gloo/impl.hpp"
#include "framework/comm/collective_args.hpp"

namespace ddp::gloo_backend::collectives {

// BlockCounts (framework/comm/collective_args.hpp), and for alltoall the
// splits that every rank publishes before any block is read.
struct BlockPlan : BlockCounts {
  // alltoall: this rank's table (its splits), published to every rank
  // before any block is read, and the check of every rank's table (by rank,
  // this one's included, and the collective's sequence number), which
  // throws when they disagree and returns the largest count of any pair.
  // Empty: nothing is published (gather, scatter: `largest` is known).
  std::vector<int64_t> table;
  std::function<int64_t(const std::vector<const int64_t*>&, uint64_t seq)> checkTables;
};

// Local, Shm, Frame or PointToPoint, by the group's transports.
ProcessGroupGloo::Impl::Path blockPath(const ProcessGroupGloo::Impl& g);

// Queues collective `d` (its descriptor filled in but for seq) that moves
// the blocks of `plan` from `input` to `output`, either undefined where the
// plan moves nothing from or into it (gather off the root, scatter's input
// off the root). Tensors of any device and layout are staged through flat
// host ones; the result is copied back into `output`.
WorkPtr enqueueBlocks(ProcessGroupGloo::Impl& g, const Descriptor& d, const std::string& summary,
                      Milliseconds timeout, const at::Tensor& input, const at::Tensor& output, BlockPlan plan);

// On the thread that runs collective `d`: copies this rank's own block,
// then moves the others over `path`. `input` and `output` are flat,
// contiguous host tensors (either may be undefined where the plan moves
// nothing from or into it).
void moveBlocks(ProcessGroupGloo::Impl& g, ProcessGroupGloo::Impl::Path path, const Descriptor& d,
                const at::Tensor& input, const at::Tensor& output, const BlockPlan& plan, Deadline deadline);

}  // namespace ddp::gloo_backend::collectives
