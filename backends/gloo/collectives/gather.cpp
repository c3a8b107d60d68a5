// gather: every rank's input into slice r of the root's output, a block
// from each rank to the root (blocks.hpp): through shared memory, over the
// frames' mesh, or point to point above 8 TCP ranks. Each rank moves its
// input once, not the size() times of the allgather default.
#include <ATen/ATen.h>

#include "backends/gloo/collectives/blocks.hpp"
#include "backends/gloo/collectives/collectives.hpp"
#include "backends/gloo/impl.hpp"
#include "framework/comm/collective_args.hpp"

namespace ddp::gloo_backend::collectives {

WorkPtr gather(Impl& g, const at::Tensor& input, at::Tensor& output, int root, Milliseconds timeout) {
  checkGather(g.rank, g.size, input, output, root);
  requireSupported(input, "gather");
  const bool isRoot = g.rank == root;
  if (isRoot) requireSupported(output, "gather");
  Descriptor d;
  d.op = kGather;
  d.dtype = static_cast<uint32_t>(input.scalar_type());
  d.numel = input.numel();
  d.root = root;

  BlockPlan plan;
  static_cast<BlockCounts&>(plan) = gatherBlocks(g.rank, g.size, root, input.numel());
  return enqueueBlocks(g, d, summarize(input), timeout, input, isRoot ? output : at::Tensor(), std::move(plan));
}

}  // namespace ddp::gloo_backend::collectives
