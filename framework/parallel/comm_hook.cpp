#include "framework/parallel/comm_hook.hpp"

#include <exception>

namespace ddp {

std::vector<at::Tensor> GradBucket::gradients() const {
  std::vector<at::Tensor> out;
  int64_t offset = 0;
  for (const at::Tensor& p : parameters) {
    out.push_back(buffer.narrow(0, offset, p.numel()).view(p.sizes()));
    offset += p.numel();
  }
  return out;
}

WorkPtr AllreduceAvgHook::run(ProcessGroup& group, GradBucket& bucket) {
  AllreduceOptions opts;
  opts.op = ReduceOp::Avg;
  opts.timeout = timeout_;
  return group.allreduce(bucket.buffer, opts);
}

WorkPtr thenWork(const WorkPtr& first, Milliseconds timeout, std::function<void()> then) {
  auto next = std::make_shared<Work>(first->description() + " (then)", timeout);
  first->onFinish([first, next, then = std::move(then)] {
    std::exception_ptr error = first->exception();
    if (!error) {
      try {
        then();
      } catch (...) {
        error = std::current_exception();
      }
    }
    next->finish(error);
  });
  return next;
}

}  // namespace ddp
