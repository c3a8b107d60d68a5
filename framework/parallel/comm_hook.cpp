#include "framework/parallel/comm_hook.hpp"

#include <exception>

namespace ddp {

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
