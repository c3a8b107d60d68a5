// Blocks (blocks.hpp): a block per ordered pair of ranks, over shared
// memory, the frames' mesh or point-to-point messages.
#include "backends/gloo/collectives/blocks.hpp"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "framework/core/errors.hpp"

namespace ddp::gloo_backend::collectives {

using Impl = ProcessGroupGloo::Impl;

Impl::Path blockPath(const Impl& g) {
  if (g.size == 1) return Impl::Path::Local;
  if (g.shm) return Impl::Path::Shm;
  if (g.frames && g.frames->isMesh()) return Impl::Path::Frame;
  return Impl::Path::PointToPoint;
}

namespace {

uint8_t* bytesOf(const at::Tensor& t) { return t.defined() ? static_cast<uint8_t*>(t.data_ptr()) : nullptr; }

// Every rank's table, copied out of the areas (a frame's payload may sit at
// any alignment; this rank's area is null: its own table).
std::vector<std::vector<int64_t>> tablesOf(const std::vector<const uint8_t*>& areas, const BlockPlan& plan, int rank) {
  std::vector<std::vector<int64_t>> tables(areas.size(), plan.table);
  for (size_t p = 0; p < areas.size(); ++p) {
    if (static_cast<int>(p) != rank) std::memcpy(tables[p].data(), areas[p], plan.table.size() * sizeof(int64_t));
  }
  return tables;
}

int64_t checkAll(const std::vector<std::vector<int64_t>>& tables, const BlockPlan& plan, uint64_t seq) {
  std::vector<const int64_t*> pointers;
  for (const auto& t : tables) pointers.push_back(t.data());
  return plan.checkTables(pointers, seq);
}

void overPointToPoint(Impl& g, const Descriptor& d, const at::Tensor& input, const at::Tensor& output,
                      const BlockPlan& plan, Deadline deadline) {
  std::vector<at::Tensor> sends(static_cast<size_t>(g.size)), recvs(static_cast<size_t>(g.size));
  for (size_t p = 0; p < sends.size(); ++p) {  // empty blocks of an exchanging pair too
    if (plan.sendsTo[p]) sends[p] = input.narrow(0, plan.sendAt[p], plan.sendCount[p]);
    if (plan.receivesFrom[p]) recvs[p] = output.narrow(0, plan.recvAt[p], plan.recvCount[p]);
  }
  // Internal tags are negative (users' are >= 0), one per collective.
  const int tag = -1 - static_cast<int>(d.seq % (uint64_t(1) << 30));
  exchangeBlocks(*g.p2p, g.rank, g.size, sends, recvs, tag, deadline,
                 fmt::format("[rank {}/{}] gloo {} #{}", g.rank, g.size, opName(d.op), d.seq));
}

}  // namespace

void moveBlocks(Impl& g, Impl::Path path, const Descriptor& d, const at::Tensor& input, const at::Tensor& output,
                const BlockPlan& plan, Deadline deadline) {
  const int rank = g.rank, size = g.size;
  const size_t me = static_cast<size_t>(rank);
  const size_t es = c10::elementSize(static_cast<at::ScalarType>(d.dtype));
  uint8_t* src = bytesOf(input);
  uint8_t* dst = bytesOf(output);
  if (plan.sendCount[me] > 0) {
    std::memcpy(dst + plan.recvAt[me] * es, src + plan.sendAt[me] * es, static_cast<size_t>(plan.sendCount[me]) * es);
  }
  switch (path) {
    case Impl::Path::Local: return;
    case Impl::Path::Shm: {
      int64_t largest = plan.largest;
      const bool published = !plan.table.empty();
      if (published) {
        largest = checkAll(
            tablesOf(g.shm->exchange(d, plan.table.data(), plan.table.size() * sizeof(int64_t), deadline), plan, rank),
            plan, d.seq);
      }
      g.shm->moveBlocks(d, src, dst, es, plan.sendAt, plan.sendCount, plan.recvAt, plan.recvCount, largest,
                        /*first=*/!published, deadline);
      return;
    }
    case Impl::Path::Frame: {
      std::vector<FrameExchange::Span> sends(static_cast<size_t>(size)), recvs(static_cast<size_t>(size));
      for (size_t p = 0; p < static_cast<size_t>(size); ++p) {
        if (p == me) continue;
        if (plan.sendCount[p] > 0) sends[p] = {src + plan.sendAt[p] * es, static_cast<size_t>(plan.sendCount[p]) * es};
        if (plan.recvCount[p] > 0) recvs[p] = {dst + plan.recvAt[p] * es, static_cast<size_t>(plan.recvCount[p]) * es};
      }
      g.frames->exchangeThenTransfer(
          d, plan.table.data(), plan.table.size() * sizeof(int64_t), sends, recvs,
          [&](const std::vector<const uint8_t*>& areas) {
            if (!plan.table.empty()) checkAll(tablesOf(areas, plan, rank), plan, d.seq);
          },
          deadline);
      return;
    }
    case Impl::Path::PointToPoint: overPointToPoint(g, d, input, output, plan, deadline); return;
    default: DDP_CHECK(false, "no block path");
  }
}

WorkPtr enqueueBlocks(Impl& g, const Descriptor& d, const std::string& summary, Milliseconds timeout,
                      const at::Tensor& input, const at::Tensor& output, BlockPlan plan) {
  const Impl::Path path = blockPath(g);
  // Whether it may run in the caller: by what this rank moves.
  const size_t payload = std::max(input.defined() ? input.nbytes() : 0, output.defined() ? output.nbytes() : 0);
  at::Tensor in = input, out = output;
  auto run = [g = &g, path, in, out, plan = std::move(plan)](const Descriptor& d, Deadline deadline) mutable {
    at::Tensor src = in.defined() ? hostView(in).view({-1}) : at::Tensor();
    const bool direct = !out.defined() || (out.device().is_cpu() && out.is_contiguous());
    at::Tensor dst = !out.defined() ? at::Tensor()
                     : direct       ? out.view({-1})
                                    : at::empty({out.numel()}, out.options().device(at::kCPU));
    moveBlocks(*g, path, d, src, dst, plan, deadline);
    if (!direct) out.copy_(dst.view(out.sizes()));
  };
  return g.enqueue(d, summary, timeout, path, std::move(run), payload);
}

}  // namespace ddp::gloo_backend::collectives
