// scatter: slice r of the root's input to rank r, a block from the root to
// each rank (blocks.hpp): through shared memory, over the frames' mesh, or
// point to point above 8 TCP ranks. The root sends each slice once, not
// the whole input to every rank as the broadcast default does.
#include <ATen/ATen.h>

#include "backends/gloo/collectives/blocks.hpp"
#include "backends/gloo/collectives/collectives.hpp"
#include "backends/gloo/impl.hpp"
#include "framework/comm/collective_args.hpp"

namespace ddp::gloo_backend::collectives {

WorkPtr scatter(Impl& g, const at::Tensor& input, at::Tensor& output, int root, Milliseconds timeout) {
  checkScatter(g.rank, g.size, input, output, root);
  requireSupported(output, "scatter");
  const bool isRoot = g.rank == root;
  if (isRoot) requireSupported(input, "scatter");
  Descriptor d;
  d.op = kScatter;
  d.dtype = static_cast<uint32_t>(output.scalar_type());
  d.numel = output.numel();
  d.root = root;

  BlockPlan plan;
  static_cast<BlockCounts&>(plan) = scatterBlocks(g.rank, g.size, root, output.numel());
  return enqueueBlocks(g, d, summarize(output), timeout, isRoot ? input : at::Tensor(), output, std::move(plan));
}

}  // namespace ddp::gloo_backend::collectives
