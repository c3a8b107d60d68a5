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


}  // namespace ddp
