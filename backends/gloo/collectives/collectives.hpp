// The collectives of ProcessGroupGloo, one per file in this folder. Each
// checks its arguments on the calling thread (UsageError), fills in a
// Descriptor, picks its path with Impl::pathFor() and queues the work that
// runs on the worker thread. A new collective is a new file here, its
// declaration below and one dispatch line in process_group_gloo.cpp.
#pragma once

#include <ATen/core/Tensor.h>

#include "backends/gloo/process_group_gloo.hpp"

namespace ddp::gloo_backend::collectives {

using Impl = ProcessGroupGloo::Impl;

WorkPtr allreduce(Impl& g, at::Tensor& tensor, ReduceOp op, Milliseconds timeout);
WorkPtr broadcast(Impl& g, at::Tensor& tensor, int root, Milliseconds timeout);
WorkPtr allgather(Impl& g, const at::Tensor& input, at::Tensor& output, Milliseconds timeout);
WorkPtr reduceScatter(Impl& g, const at::Tensor& input, at::Tensor& output, ReduceOp op, Milliseconds timeout);
WorkPtr barrier(Impl& g, Milliseconds timeout);
WorkPtr gather(Impl& g, const at::Tensor& input, at::Tensor& output, int root, Milliseconds timeout);
WorkPtr scatter(Impl& g, const at::Tensor& input, at::Tensor& output, int root, Milliseconds timeout);
WorkPtr alltoall(Impl& g, const at::Tensor& input, at::Tensor& output, const std::vector<int64_t>& inputSplits,
                 const std::vector<int64_t>& outputSplits, Milliseconds timeout);

}  // namespace ddp::gloo_backend::collectives
