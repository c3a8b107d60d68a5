// gather: every rank's input into slice r of the root's output, a block
// from each rank to the root (blocks.hpp): through shared memory, over the
// frames' mesh, or point to point above 8 TCP ranks. Each rank moves its
// input once, not the size() times of the allgather default.
#include <ATen/ATen.h>

#include <algorithm>

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

  const int64_t n = input.numel();
  const size_t size = static_cast<size_t>(g.size);
  BlockPlan plan;
  plan.sendAt.assign(size, 0);
  plan.sendCount.assign(size, 0);
  plan.recvAt.assign(size, 0);
  plan.recvCount.assign(size, 0);
  plan.sendCount[static_cast<size_t>(root)] = n;
  if (isRoot) {
    for (size_t i = 0; i < size; ++i) {
      plan.recvAt[i] = static_cast<int64_t>(i) * n;
      plan.recvCount[i] = n;
    }
  }
  plan.largest = n;

  const Impl::Path path = blockPath(g);
  const size_t payload = isRoot ? output.nbytes() : input.nbytes();
  at::Tensor in = input, out = isRoot ? output : at::Tensor();
  auto run = [g = &g, path, in, out, plan, isRoot](const Descriptor& d, Deadline deadline) mutable {
    at::Tensor src = in.detach().to(at::kCPU).contiguous().view({-1});
    const bool direct = !isRoot || (out.device().is_cpu() && out.is_contiguous());
    at::Tensor dst = !isRoot ? at::Tensor()
                     : direct ? out.view({-1})
                              : at::empty({out.numel()}, out.options().device(at::kCPU));
    moveBlocks(*g, path, d, src, dst, plan, deadline);
    if (!direct) out.copy_(dst.view(out.sizes()));
  };
  return g.enqueue(d, summarize(input), timeout, path, std::move(run), payload);
}

}  // namespace ddp::gloo_backend::collectives
