// ProcessGroup's default reduce, gather, scatter and alltoall
// (process_group.hpp): each built on allreduce, allgather or broadcast, so
// that every backend has them. Arguments are checked on the calling thread
// (UsageError naming the rank and the operation); scratch tensors live in
// the Work's continuation until the collective has finished.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <memory>

#include "framework/comm/collective_args.hpp"
#include "framework/comm/process_group.hpp"
#include "framework/core/errors.hpp"

namespace ddp {

WorkPtr ProcessGroup::reduce(at::Tensor& tensor, const ReduceOptions& opts) {
  checkRoot(rank_, size_, opts.root, "reduce");
  AllreduceOptions all;
  all.op = opts.op;
  all.timeout = opts.timeout;
  if (rank_ == opts.root) return allreduce(tensor, all);
  auto copy = std::make_shared<at::Tensor>(tensor.clone());
  WorkPtr work = allreduce(*copy, all);
  return thenWork(work, resolveTimeout(opts.timeout), [copy] {});
}

WorkPtr ProcessGroup::gather(const at::Tensor& input, at::Tensor& output, const GatherOptions& opts) {
  checkGather(rank_, size_, input, output, opts.root);
  AllgatherOptions all;
  all.timeout = opts.timeout;
  if (rank_ == opts.root) return allgather(input, output, all);
  auto scratch = std::make_shared<at::Tensor>(at::empty({input.numel() * size_}, input.options()));
  WorkPtr work = allgather(input, *scratch, all);
  return thenWork(work, resolveTimeout(opts.timeout), [scratch] {});
}

WorkPtr ProcessGroup::scatter(const at::Tensor& input, at::Tensor& output, const ScatterOptions& opts) {
  checkScatter(rank_, size_, input, output, opts.root);
  const int64_t n = output.numel();
  auto whole = std::make_shared<at::Tensor>();
  if (rank_ == opts.root) {
    *whole = input.reshape({-1}).clone();
  } else {
    *whole = at::empty({n * size_}, output.options());
  }
  BroadcastOptions b;
  b.root = opts.root;
  b.timeout = opts.timeout;
  WorkPtr work = broadcast(*whole, b);
  at::Tensor target = output;
  const int64_t offset = n * rank_;
  return thenWork(work, resolveTimeout(opts.timeout), [whole, target, offset, n]() mutable {
    target.view({-1}).copy_(whole->narrow(0, offset, n));
  });
}

WorkPtr ProcessGroup::alltoall(const at::Tensor& input, at::Tensor& output, const std::vector<int64_t>& inputSplits,
                               const std::vector<int64_t>& outputSplits, const AlltoallOptions& opts) {
  const AlltoallSplits splits = checkAlltoall(rank_, size_, input, output, inputSplits, outputSplits);
  const std::vector<int64_t>& sendRows = splits.send;
  const std::vector<int64_t>& recvRows = splits.recv;
  const int64_t rowElems = splits.rowElements;
  const auto bad = [&](const std::string& what) {
    fail<UsageError>("[rank {}/{}] alltoall: {}", rank_, size_, what);
  };
  const Milliseconds timeout = resolveTimeout(opts.timeout);
  AllgatherOptions all;
  all.timeout = opts.timeout;

  // Every rank's send and receive counts (waited for here, so that every
  // rank checks the whole table and all fail alike), then every rank's
  // input padded to the largest; each rank takes its rows out of every
  // source's.
  std::vector<int64_t> mine = sendRows;
  mine.insert(mine.end(), recvRows.begin(), recvRows.end());
  // On the input's device: a GPU backend moves device tensors only.
  at::Tensor counts = at::tensor(mine, at::kLong).to(input.device());
  at::Tensor everyone = at::empty({int64_t(size_) * 2 * size_}, input.options().dtype(at::kLong));
  allgather(counts, everyone, all)->wait();
  const at::Tensor table = everyone.cpu();
  const int64_t* c = table.data_ptr<int64_t>();
  const auto sends = [&](int i, int j) { return c[(int64_t(i) * 2) * size_ + j]; };
  const auto expects = [&](int j, int i) { return c[(int64_t(j) * 2 + 1) * size_ + i]; };
  int64_t widest = 0;
  std::vector<int64_t> table64(static_cast<size_t>(size_) * size_);
  for (int i = 0; i < size_; ++i) {
    int64_t rows = 0;
    for (int j = 0; j < size_; ++j) {
      if (sends(i, j) != expects(j, i)) {
        bad(fmt::format("rank {} sends {} row(s) to rank {}, whose outputSplits[{}] expects {}", i, sends(i, j), j, i,
                        expects(j, i)));
      }
      table64[static_cast<size_t>(i * size_ + j)] = sends(i, j);
      rows += sends(i, j);
    }
    widest = std::max(widest, rows);
  }
  auto padded = std::make_shared<at::Tensor>(at::zeros({widest * rowElems}, input.options()));
  if (input.numel() > 0) padded->narrow(0, 0, input.numel()).copy_(input.reshape({-1}));
  auto gathered = std::make_shared<at::Tensor>(at::empty({int64_t(size_) * widest * rowElems}, input.options()));
  WorkPtr work = allgather(*padded, *gathered, all);
  at::Tensor target = output;
  const int size = size_, rank = rank_;
  return thenWork(work, timeout, [padded, gathered, target, table64, size, rank, widest, rowElems]() mutable {
    at::Tensor flat = target.view({-1});
    int64_t at = 0;
    for (int i = 0; i < size; ++i) {
      int64_t skip = 0;  // rows source i sends to ranks before this one
      for (int j = 0; j < rank; ++j) skip += table64[static_cast<size_t>(i * size + j)];
      const int64_t rows = table64[static_cast<size_t>(i * size + rank)];
      if (rows == 0) continue;
      flat.narrow(0, at, rows * rowElems)
          .copy_(gathered->narrow(0, (int64_t(i) * widest + skip) * rowElems, rows * rowElems));
      at += rows * rowElems;
    }
  });
}

}  // namespace ddp
