#include "backends/nccl/process_group_nccl.hpp"

#include <ATen/ATen.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>

#include "ddp/config.hpp"
#include "framework/core/errors.hpp"
#include "framework/core/help_links.hpp"
#include "framework/core/log.hpp"
#include "framework/store/prefix_store.hpp"

#if DDP_TORCH_HAS_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

namespace ddp {
namespace {

using Clock = std::chrono::steady_clock;

std::string cudaText(cudaError_t e) { return fmt::format("{}: {}", cudaGetErrorName(e), cudaGetErrorString(e)); }

ncclDataType_t ncclTypeFor(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return ncclFloat32;
    case at::kDouble: return ncclFloat64;
    case at::kHalf: return ncclFloat16;
    case at::kBFloat16: return ncclBfloat16;
    case at::kInt: return ncclInt32;
    case at::kLong: return ncclInt64;
    default:
      fail<UsageError>("nccl: dtype {} is not supported; use float32, float64, float16, bfloat16, int32 or int64",
                       c10::toString(t));
  }
}

ncclRedOp_t ncclOpFor(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;
    case ReduceOp::Min: return ncclMin;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Product: return ncclProd;
  }
  return ncclSum;
}

std::string tensorSummary(const at::Tensor& t, const std::string& extra = "") {
  return extra.empty() ? fmt::format("{} elements, {}", t.numel(), dtypeName(t))
                       : fmt::format("{} elements, {}, {}", t.numel(), dtypeName(t), extra);
}

}  // namespace

struct ProcessGroupNccl::Impl {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;

  struct Pending {
    WorkPtr work;
    cudaEvent_t done = nullptr;
    Clock::time_point deadline;
    Milliseconds timeout{0};
    std::function<void()> afterSuccess;  // copies staged results back to host tensors
    std::vector<void*> deviceBuffers;    // staging, freed when done
    // The device tensors NCCL reads and writes: their memory must not go
    // back to LibTorch's caching allocator, to be reused by another stream,
    // before the operation has finished.
    std::vector<at::Tensor> inUse;
  };
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<Pending> pending;
  bool stopping = false;
  std::exception_ptr broken;

  void check(cudaError_t e, const std::string& what) {
    if (e != cudaSuccess) fail<CollectiveError>("{}: {}", what, cudaText(e));
  }
  void check(ncclResult_t r, const std::string& what) {
    if (r != ncclSuccess) fail<CollectiveError>("{}: {}", what, ncclGetErrorString(r));
  }

  // The communicator is non-blocking (so that a peer that never arrives
  // cannot hang ncclCommInitRank): a call may return ncclInProgress, and
  // NCCL must then be polled until it has finished before the next call.
  // Throws with `what` on an error, or when `deadline` passes first.
  void settle(ncclResult_t r, const std::string& what, Clock::time_point deadline, Milliseconds timeout) {
    while (r == ncclInProgress) {
      if (Clock::now() > deadline) {
        fail<CollectiveError>("{} did not complete within {} ms. HINT: a peer rank may not have started, or died; {}",
                              what, timeout.count(), kRendezvousHelp);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
      ncclCommGetAsyncError(comm, &r);
    }
    check(r, what);
  }
};

static std::optional<std::string> ncclUnusable() {
  if (cudaDeviceCount() > 0) return std::nullopt;
  return std::string("backend nccl needs CUDA devices; found 0. HINT: use \"gloo\" on CPUs");
}

int cudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

ProcessGroupNccl::ProcessGroupNccl(std::shared_ptr<Store> store, int rank, int size, ProcessGroupOptions options)
    : ProcessGroup(rank, size, std::move(options)), impl_(std::make_unique<Impl>()) {
  if (auto why = ncclUnusable()) throw UsageError(*why);
  const int devices = cudaDeviceCount();
  int local = options_.deviceIndex;
  if (local < 0) {
    const char* lr = std::getenv("LOCAL_RANK");
    local = lr ? std::atoi(lr) : rank;
  }
  device_ = local % devices;
  const std::string who = fmt::format("[rank {}/{}] nccl", rank, size);
  impl_->check(cudaSetDevice(device_), fmt::format("{}: cudaSetDevice({})", who, device_));
  impl_->check(cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking), who + ": cudaStreamCreate");

  PrefixStore scoped("nccl", store);
  ncclUniqueId id;
  if (rank == 0) {
    impl_->check(ncclGetUniqueId(&id), who + ": ncclGetUniqueId");
    scoped.set("unique_id", Bytes(reinterpret_cast<uint8_t*>(&id), reinterpret_cast<uint8_t*>(&id) + sizeof(id)));
  } else {
    Bytes b = scoped.get("unique_id");
    if (b.size() != sizeof(id)) fail<CollectiveError>("{}: the store holds a malformed NCCL unique id", who);
    std::memcpy(&id, b.data(), sizeof(id));
  }
  const std::string initWhat = fmt::format("{}: ncclCommInitRank on cuda:{}", who, device_);
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const ncclResult_t started = ncclCommInitRankConfig(&impl_->comm, size, id, rank, &config);
  try {
    impl_->settle(started, initWhat, Clock::now() + options_.timeout, options_.timeout);
  } catch (...) {
    if (impl_->comm) ncclCommAbort(impl_->comm);
    impl_->comm = nullptr;
    cudaStreamDestroy(impl_->stream);
    impl_->stream = nullptr;
    throw;
  }
#else
  // Older NCCL has no non-blocking initialisation: a peer that never
  // arrives blocks here.
  impl_->check(ncclCommInitRank(&impl_->comm, size, id, rank), initWhat);
#endif
  logInfo("{}: group created on cuda:{} ({} ranks, NCCL {})", who, device_, size, NCCL_VERSION_CODE);
  watchdog_ = std::thread([this] { watchdogLoop(); });
}

ProcessGroupNccl::~ProcessGroupNccl() {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->stopping = true;
  }
  impl_->changed.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
  if (impl_->comm) {
    if (impl_->broken) ncclCommAbort(impl_->comm);
    else ncclCommDestroy(impl_->comm);
  }
  if (impl_->stream) cudaStreamDestroy(impl_->stream);
}

WorkPtr ProcessGroupNccl::launch(const char* op, const at::Tensor& in, const at::Tensor& out, bool outputIsInput,
                                 Milliseconds timeout, const std::string& summary,
                                 const std::function<int(void*, void*, void*)>& issue) {
  const uint64_t seq = nextSeq_++;
  const std::string description = fmt::format("[rank {}/{}] nccl {} #{} ({})", rank_, size_, op, seq, summary);
  auto work = std::make_shared<Work>(description, timeout);
  logDebug("{} queued, path {}", description,
           in.is_cuda() || out.is_cuda() ? "device" : "host staged through device buffers");
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    if (impl_->broken) {
      try {
        std::rethrow_exception(impl_->broken);
      } catch (const std::exception& e) {
        work->finish(std::make_exception_ptr(
            CollectiveError(fmt::format("{} not run: the group failed earlier: {}", description, e.what()))));
        return work;
      }
    }
  }
  impl_->check(cudaSetDevice(device_), description + ": cudaSetDevice");
  Impl::Pending p;
  p.work = work;
  p.timeout = timeout;
  p.deadline = Clock::now() + timeout;
  cudaStream_t stream = impl_->stream;
  void* sendPtr = nullptr;
  void* recvPtr = nullptr;
  at::Tensor hostIn, hostOut;
  // Device tensors are used where they are; host tensors are staged.
  const bool onDevice = in.is_cuda() || out.is_cuda();
  if (onDevice) {
#if DDP_TORCH_HAS_CUDA
    for (const at::Tensor* t : {&in, &out}) {
      if (!t->is_cuda() || t->device().index() != device_) {
        fail<UsageError>("{}: tensor on {}, but this rank's group uses cuda:{}. HINT: move inputs and outputs to "
                         "cuda:{} (rank -> cuda:LOCAL_RANK)",
                         description, t->device().str(), device_, device_);
      }
    }
    // NCCL reads and writes dense memory: strided tensors go through
    // contiguous copies (made on the current stream, so the event below
    // orders the collective after them too).
    at::Tensor sendTensor = in.contiguous();
    at::Tensor recvTensor = outputIsInput ? sendTensor : out.contiguous();
    // Order after the stream that produced the tensor.
    cudaStream_t producer = c10::cuda::getCurrentCUDAStream(device_).stream();
    cudaEvent_t ready;
    impl_->check(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), description + ": cudaEventCreate");
    impl_->check(cudaEventRecord(ready, producer), description + ": cudaEventRecord");
    impl_->check(cudaStreamWaitEvent(stream, ready, 0), description + ": cudaStreamWaitEvent");
    cudaEventDestroy(ready);
    sendPtr = sendTensor.data_ptr();
    recvPtr = recvTensor.data_ptr();
    const at::Tensor& target = outputIsInput ? in : out;
    if (!recvTensor.is_same(target)) {
      const int device = device_;
      p.afterSuccess = [target, recvTensor, device]() mutable {
        target.copy_(recvTensor);
        // The waiter may use `target` on any stream once the Work is done.
        cudaStreamSynchronize(c10::cuda::getCurrentCUDAStream(device).stream());
      };
    }
    p.inUse = {in, out, sendTensor, recvTensor};
#else
    fail<UsageError>("{}: CUDA tensors need a CUDA build of LibTorch", description);
#endif
  } else {
    // A CPU-only LibTorch: stage through device memory with the CUDA runtime.
    hostIn = in.contiguous();
    hostOut = outputIsInput ? hostIn : out.contiguous();
    const size_t inBytes = hostIn.nbytes(), outBytes = outputIsInput ? 0 : hostOut.nbytes();
    impl_->check(cudaMalloc(&sendPtr, std::max<size_t>(inBytes, 1)), description + ": cudaMalloc");
    p.deviceBuffers.push_back(sendPtr);
    if (outputIsInput) {
      recvPtr = sendPtr;
    } else {
      impl_->check(cudaMalloc(&recvPtr, std::max<size_t>(outBytes, 1)), description + ": cudaMalloc");
      p.deviceBuffers.push_back(recvPtr);
    }
    if (inBytes) {
      impl_->check(cudaMemcpyAsync(sendPtr, hostIn.data_ptr(), inBytes, cudaMemcpyHostToDevice, stream),
                   description + ": copy to device");
    }
  }
  try {
    impl_->check(cudaEventCreateWithFlags(&p.done, cudaEventDisableTiming), description + ": cudaEventCreate");
    impl_->settle(static_cast<ncclResult_t>(issue(sendPtr, recvPtr, stream)), description, p.deadline, timeout);
  } catch (...) {
    for (void* b : p.deviceBuffers) cudaFree(b);
    if (p.done) cudaEventDestroy(p.done);
    throw;
  }
  if (!onDevice) {
    const at::Tensor& result = outputIsInput ? hostIn : hostOut;
    if (result.nbytes()) {
      impl_->check(cudaMemcpyAsync(result.data_ptr(), recvPtr, result.nbytes(), cudaMemcpyDeviceToHost, stream),
                   description + ": copy to host");
    }
    at::Tensor target = outputIsInput ? in : out;
    if (!result.is_same(target)) {
      p.afterSuccess = [target, result]() mutable { target.copy_(result); };
    } else {
      p.afterSuccess = [result] {};  // keeps the host tensor alive until the copy is done
    }
  }
  impl_->check(cudaEventRecord(p.done, stream), description + ": cudaEventRecord");
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->pending.push_back(std::move(p));
  }
  impl_->changed.notify_all();
  return work;
}

void ProcessGroupNccl::watchdogLoop() {
  cudaSetDevice(device_);
  std::unique_lock<std::mutex> lock(impl_->mutex);
  for (;;) {
    impl_->changed.wait_for(lock, std::chrono::milliseconds(impl_->pending.empty() ? 100 : 0),
                            [&] { return impl_->stopping || !impl_->pending.empty(); });
    if (impl_->pending.empty()) {
      if (impl_->stopping) return;
      continue;
    }
    Impl::Pending& head = impl_->pending.front();
    const cudaError_t state = cudaEventQuery(head.done);
    if (state == cudaSuccess) {
      Impl::Pending done = std::move(head);
      impl_->pending.pop_front();
      lock.unlock();
      std::exception_ptr error;
      try {
        if (done.afterSuccess) done.afterSuccess();
      } catch (...) {
        error = std::current_exception();
      }
      for (void* b : done.deviceBuffers) cudaFree(b);
      cudaEventDestroy(done.done);
      done.work->finish(error);
      lock.lock();
      continue;
    }
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(impl_->comm, &async);
    // A non-blocking communicator is "in progress" while a call enqueues.
    if (async == ncclInProgress) async = ncclSuccess;
    const bool timedOut = Clock::now() > head.deadline;
    if (state != cudaErrorNotReady || async != ncclSuccess || timedOut) {
      std::string why = async != ncclSuccess         ? fmt::format("NCCL error: {}", ncclGetErrorString(async))
                        : state != cudaErrorNotReady ? fmt::format("CUDA error: {}", cudaText(state))
                                                     : fmt::format("timed out (timeout {} ms)", head.timeout.count());
      // Aborting unblocks kernels that wait for a peer that will not come.
      ncclCommAbort(impl_->comm);
      impl_->comm = nullptr;
      std::deque<Impl::Pending> failed;
      failed.swap(impl_->pending);
      auto first = std::make_exception_ptr(CollectiveError(
          fmt::format("{} {}. HINT: a peer rank may have died, or not called this collective; {}",
                      failed.front().work->description(), why, kRendezvousHelp)));
      impl_->broken = first;
      lock.unlock();
      for (size_t i = 0; i < failed.size(); ++i) {
        failed[i].work->finish(i == 0 ? first
                                      : std::make_exception_ptr(CollectiveError(fmt::format(
                                            "{} aborted after an earlier failure", failed[i].work->description()))));
      }
      lock.lock();
      continue;
    }
    // Not ready yet: poll again soon without holding the lock.
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    lock.lock();
  }
}

WorkPtr ProcessGroupNccl::allreduce(at::Tensor& tensor, const AllreduceOptions& opts) {
  const ncclDataType_t type = ncclTypeFor(tensor.scalar_type());
  const size_t count = tensor.numel();
  ncclComm_t comm = impl_->comm;
  return launch("allreduce", tensor, tensor, true, resolveTimeout(opts.timeout),
                tensorSummary(tensor, reduceOpName(opts.op)), [&](void* send, void* recv, void* stream) {
                  return ncclAllReduce(send, recv, count, type, ncclOpFor(opts.op), comm,
                                       static_cast<cudaStream_t>(stream));
                });
}

WorkPtr ProcessGroupNccl::broadcast(at::Tensor& tensor, const BroadcastOptions& opts) {
  if (opts.root < 0 || opts.root >= size_) {
    fail<UsageError>("nccl broadcast: root {} is outside world size {}", opts.root, size_);
  }
  const ncclDataType_t type = ncclTypeFor(tensor.scalar_type());
  const size_t count = tensor.numel();
  ncclComm_t comm = impl_->comm;
  return launch("broadcast", tensor, tensor, true, resolveTimeout(opts.timeout),
                tensorSummary(tensor, fmt::format("root {}", opts.root)), [&](void* send, void* recv, void* stream) {
                  return ncclBroadcast(send, recv, count, type, opts.root, comm, static_cast<cudaStream_t>(stream));
                });
}

WorkPtr ProcessGroupNccl::allgather(const at::Tensor& input, at::Tensor& output, const AllgatherOptions& opts) {
  if (output.numel() != input.numel() * size_ || input.scalar_type() != output.scalar_type()) {
    fail<UsageError>("nccl allgather: output must hold world size ({}) x input elements of the same dtype; got "
                     "input {}, output {}",
                     size_, tensorSummary(input), tensorSummary(output));
  }
  const ncclDataType_t type = ncclTypeFor(input.scalar_type());
  const size_t count = input.numel();
  ncclComm_t comm = impl_->comm;
  return launch("allgather", input, output, false, resolveTimeout(opts.timeout), tensorSummary(input),
                [&](void* send, void* recv, void* stream) {
                  return ncclAllGather(send, recv, count, type, comm, static_cast<cudaStream_t>(stream));
                });
}

WorkPtr ProcessGroupNccl::reduceScatter(const at::Tensor& input, at::Tensor& output,
                                        const ReduceScatterOptions& opts) {
  if (input.numel() != output.numel() * size_ || input.scalar_type() != output.scalar_type()) {
    fail<UsageError>("nccl reduce_scatter: input must hold world size ({}) x output elements of the same dtype; "
                     "got input {}, output {}",
                     size_, tensorSummary(input), tensorSummary(output));
  }
  const ncclDataType_t type = ncclTypeFor(input.scalar_type());
  const size_t count = output.numel();
  ncclComm_t comm = impl_->comm;
  return launch("reduce_scatter", input, output, false, resolveTimeout(opts.timeout),
                tensorSummary(input, reduceOpName(opts.op)), [&](void* send, void* recv, void* stream) {
                  return ncclReduceScatter(send, recv, count, type, ncclOpFor(opts.op), comm,
                                           static_cast<cudaStream_t>(stream));
                });
}

WorkPtr ProcessGroupNccl::barrier(const BarrierOptions& opts) {
  // NCCL has no barrier: a one-element allreduce orders every rank.
  at::Tensor one = at::ones({1});
  AllreduceOptions ao;
  ao.timeout = opts.timeout;
  return allreduce(one, ao);
}

void registerNcclBackend(BackendRegistry& registry) {
  registry.add(
      "nccl",
      [](std::shared_ptr<Store> store, int rank, int size, const ProcessGroupOptions& options) {
        return std::make_shared<ProcessGroupNccl>(std::move(store), rank, size, options);
      },
      ncclUnusable);
}

}  // namespace ddp
