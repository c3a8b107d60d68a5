// scatter: slice r of the root's input to rank r, a block from the root to
// each rank (blocks.hpp): through shared memory, over the frames' mesh, or
// point to point above 8 TCP ranks. The root sends each slice once, not
// the whole input to every rank as the broadcast default does.
#include <ATen/ATen.h>

#include <algorithm>

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

  const int64_t n = output.numel();
  const size_t size = static_cast<size_t>(g.size);
  BlockPlan plan;
  plan.sendAt.assign(size, 0);
  plan.sendCount.assign(size, 0);
  plan.recvAt.assign(size, 0);
  plan.recvCount.assign(size, 0);
  plan.recvCount[static_cast<size_t>(root)] = n;
  if (isRoot) {
    for (size_t j = 0; j < size; ++j) {
      plan.sendAt[j] = static_cast<int64_t>(j) * n;
      plan.sendCount[j] = n;
    }
  }
  plan.largest = n;

  const Impl::Path path = blockPath(g);
  const size_t payload = isRoot ? input.nbytes() : output.nbytes();
  at::Tensor in = isRoot ? input : at::Tensor(), out = output;
  auto run = [g = &g, path, in, out, plan, isRoot](const Descriptor& d, Deadline deadline) mutable {
    at::Tensor src = isRoot ? in.detach().to(at::kCPU).contiguous().view({-1}) : at::Tensor();
    const bool direct = out.device().is_cpu() && out.is_contiguous();
    at::Tensor dst = direct ? out.view({-1}) : at::empty({out.numel()}, out.options().device(at::kCPU));
    moveBlocks(*g, path, d, src, dst, plan, deadline);
    if (!direct) out.copy_(dst.view(out.sizes()));
  };
  return g.enqueue(d, summarize(output), timeout, path, std::move(run), payload);
}

}  // namespace ddp::gloo_backend::collectives
