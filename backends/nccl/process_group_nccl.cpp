#include "backends/nccl/process_group_nccl.hpp"

#include <ATen/ATen.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>

#include "ddp/config.hpp"
#include "framework/comm/collective_args.hpp"
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

// A recv's Work: NCCL receives from the named rank only.
class NcclRecvWork : public Work {
 public:
  NcclRecvWork(std::string description, Milliseconds timeout, int source)
      : Work(std::move(description), timeout), source_(source) {}
  int sourceRank() const override { return source_; }

 private:
  const int source_;
};

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
  std::string abortReason;  // abort() asked for it: the watchdog breaks the group
  // Guards `comm` and every NCCL call on it: ncclCommAbort frees the
  // communicator, so no call may be running on it then (the watchdog
  // takes this without `mutex` held; launch() never takes `mutex` under it).
  std::mutex commMutex;
  // Set before the watchdog aborts: an enqueue that settle() is polling
  // gives up at once instead of holding commMutex until its deadline.
  std::atomic<bool> stopIssuing{false};
  std::string abortedWith;  // why the communicator was aborted (under commMutex)

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
      if (stopIssuing) fail<CollectiveError>("{} given up: the group is being aborted", what);
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

WorkPtr ProcessGroupNccl::launch(const char* op, const at::Tensor& in, const at::Tensor& out, Flow flow,
                                 Milliseconds timeout, const std::string& summary,
                                 const std::function<int(void*, void*, void*)>& issue, int sourceRank) {
  const bool outputIsInput = flow != Flow::OutOfPlace;
  const bool upload = flow != Flow::ReceiveOnly;   // the input's bytes matter
  const bool download = flow != Flow::SendOnly;    // the result goes back into a tensor
  const uint64_t seq = nextSeq_++;
  const std::string description = fmt::format("[rank {}/{}] nccl {} #{} ({})", rank_, size_, op, seq, summary);
  WorkPtr work = sourceRank >= 0 ? std::make_shared<NcclRecvWork>(description, timeout, sourceRank)
                                 : std::make_shared<Work>(description, timeout);
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
    if (download && !recvTensor.is_same(target)) {
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
    if (inBytes && upload) {
      impl_->check(cudaMemcpyAsync(sendPtr, hostIn.data_ptr(), inBytes, cudaMemcpyHostToDevice, stream),
                   description + ": copy to device");
    }
  }
  try {
    impl_->check(cudaEventCreateWithFlags(&p.done, cudaEventDisableTiming), description + ": cudaEventCreate");
    // The collectives' `issue` use the communicator they read before
    // launch(): it is valid while it is still the group's, under commMutex.
    std::lock_guard<std::mutex> commLock(impl_->commMutex);
    if (impl_->comm == nullptr || impl_->stopIssuing) {
      fail<CollectiveError>("{} not run: the group was aborted: {}", description,
                            impl_->abortedWith.empty() ? std::string("(aborting)") : impl_->abortedWith);
    }
    impl_->settle(static_cast<ncclResult_t>(issue(sendPtr, recvPtr, stream)), description, p.deadline, timeout);
  } catch (...) {
    for (void* b : p.deviceBuffers) cudaFree(b);
    if (p.done) cudaEventDestroy(p.done);
    throw;
  }
  if (!onDevice && !download) {
    p.afterSuccess = [hostIn] {};  // keeps the host tensor alive until the upload is done
  } else if (!onDevice) {
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
    impl_->changed.wait_for(lock, std::chrono::milliseconds(impl_->pending.empty() ? 100 : 0), [&] {
      return impl_->stopping || !impl_->pending.empty() || (!impl_->abortReason.empty() && !impl_->broken);
    });
    if (!impl_->abortReason.empty() && !impl_->broken) {
      // abort(): the communicator goes (its kernels waiting for a peer end),
      // every pending operation and every later one fails with the reason.
      const std::string reason = impl_->abortReason;
      lock.unlock();
      abortCommunicator(reason);
      lock.lock();
      std::deque<Impl::Pending> failed;
      failed.swap(impl_->pending);
      impl_->broken = std::make_exception_ptr(CollectiveError(
          fmt::format("[rank {}/{}] nccl: the group was aborted: {}", rank_, size_, reason)));
      lock.unlock();
      for (Impl::Pending& f : failed) {
        f.work->finish(std::make_exception_ptr(
            CollectiveError(fmt::format("{} aborted: {}", f.work->description(), reason))));
      }
      lock.lock();
      continue;
    }
    if (impl_->broken && !impl_->pending.empty()) {
      // Enqueued while the group was being aborted: the communicator is gone.
      std::deque<Impl::Pending> failed;
      failed.swap(impl_->pending);
      lock.unlock();
      for (Impl::Pending& f : failed) {
        f.work->finish(std::make_exception_ptr(
            CollectiveError(fmt::format("{} aborted after an earlier failure", f.work->description()))));
      }
      lock.lock();
      continue;
    }
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
    {
      // launch() holds commMutex while NCCL enqueues (which a dead peer can
      // stretch to the deadline): look next time rather than wait here
      // holding `mutex`, which abort() needs.
      std::unique_lock<std::mutex> commLock(impl_->commMutex, std::try_to_lock);
      if (commLock.owns_lock() && impl_->comm) ncclCommGetAsyncError(impl_->comm, &async);
    }
    // A non-blocking communicator is "in progress" while a call enqueues.
    if (async == ncclInProgress) async = ncclSuccess;
    const bool timedOut = Clock::now() > head.deadline;
    if (state != cudaErrorNotReady || async != ncclSuccess || timedOut) {
      std::string why = async != ncclSuccess         ? fmt::format("NCCL error: {}", ncclGetErrorString(async))
                        : state != cudaErrorNotReady ? fmt::format("CUDA error: {}", cudaText(state))
                                                     : fmt::format("timed out (timeout {} ms)", head.timeout.count());
      // Aborting unblocks kernels that wait for a peer that will not come.
      lock.unlock();
      abortCommunicator(why);
      lock.lock();
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

void ProcessGroupNccl::abortCommunicator(const std::string& why) {
  impl_->stopIssuing = true;  // an enqueue being polled gives up, releasing commMutex
  std::lock_guard<std::mutex> commLock(impl_->commMutex);
  if (impl_->comm) ncclCommAbort(impl_->comm);
  impl_->comm = nullptr;
  if (impl_->abortedWith.empty()) impl_->abortedWith = why;
}

void ProcessGroupNccl::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    if (impl_->broken || !impl_->abortReason.empty()) return;
    impl_->abortReason = reason.empty() ? std::string("aborted by the caller") : reason;
  }
  impl_->changed.notify_all();
}

WorkPtr ProcessGroupNccl::allreduce(at::Tensor& tensor, const AllreduceOptions& opts) {
  const ncclDataType_t type = ncclTypeFor(tensor.scalar_type());
  const size_t count = tensor.numel();
  ncclComm_t comm = impl_->comm;
  return launch("allreduce", tensor, tensor, Flow::InPlace, resolveTimeout(opts.timeout),
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
  return launch("broadcast", tensor, tensor, Flow::InPlace, resolveTimeout(opts.timeout),
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
  return launch("allgather", input, output, Flow::OutOfPlace, resolveTimeout(opts.timeout), tensorSummary(input),
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
  return launch("reduce_scatter", input, output, Flow::OutOfPlace, resolveTimeout(opts.timeout),
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

// ---- point to point, and the collectives built on it ---------------------------------

namespace {
void checkPeer(int rank, int size, int peer, const char* op, const char* role) {
  if (peer < 0 || peer >= size || peer == rank) {
    fail<UsageError>("[rank {}/{}] nccl {}: {} {} is not another rank of the group{}", rank, size, op, role, peer,
                     peer == kAnySourceRank ? ". HINT: NCCL receives from a named rank only; pass the sender's rank"
                                            : "");
  }
}
void checkTag(int rank, int size, int tag, const char* op) {
  if (tag != 0) {
    fail<UsageError>("[rank {}/{}] nccl {}: tag {}: NCCL has no tags (messages between two ranks match in call "
                     "order). HINT: leave the tag 0 and post sends and recvs in the same order on both ranks",
                     rank, size, op, tag);
  }
}
}  // namespace

WorkPtr ProcessGroupNccl::send(const at::Tensor& tensor, int dst, const SendOptions& opts) {
  checkPeer(rank_, size_, dst, "send", "destination");
  checkTag(rank_, size_, opts.tag, "send");
  const ncclDataType_t type = ncclTypeFor(tensor.scalar_type());
  const size_t count = tensor.numel();
  ncclComm_t comm = impl_->comm;
  return launch("send", tensor, tensor, Flow::SendOnly, resolveTimeout(opts.timeout),
                tensorSummary(tensor, fmt::format("to rank {}", dst)), [&](void* send, void*, void* stream) {
                  return ncclSend(send, count, type, dst, comm, static_cast<cudaStream_t>(stream));
                });
}

WorkPtr ProcessGroupNccl::recv(at::Tensor& tensor, int src, const RecvOptions& opts) {
  checkPeer(rank_, size_, src, "recv", "source");
  checkTag(rank_, size_, opts.tag, "recv");
  const ncclDataType_t type = ncclTypeFor(tensor.scalar_type());
  const size_t count = tensor.numel();
  ncclComm_t comm = impl_->comm;
  return launch(
      "recv", tensor, tensor, Flow::ReceiveOnly, resolveTimeout(opts.timeout),
      tensorSummary(tensor, fmt::format("from rank {}", src)),
      [&](void*, void* recv, void* stream) {
        return ncclRecv(recv, count, type, src, comm, static_cast<cudaStream_t>(stream));
      },
      src);
}

// A block per pair of ranks in one NCCL group call; this rank's own block
// is a device copy. Counts and offsets are in elements.
int ProcessGroupNccl::issueBlocks(void* send, void* recv, void* stream, at::ScalarType dtype,
                                  const BlockCounts& blocks) {
  const std::vector<int64_t>& sendAt = blocks.sendAt;
  const std::vector<int64_t>& sendCount = blocks.sendCount;
  const std::vector<int64_t>& recvAt = blocks.recvAt;
  const std::vector<int64_t>& recvCount = blocks.recvCount;
  const ncclDataType_t type = ncclTypeFor(dtype);
  const size_t es = c10::elementSize(dtype);
  auto* in = static_cast<uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  auto* s = static_cast<cudaStream_t>(stream);
  const auto me = static_cast<size_t>(rank_);
  if (sendCount[me] > 0) {
    const cudaError_t copied = cudaMemcpyAsync(out + recvAt[me] * es, in + sendAt[me] * es,
                                               static_cast<size_t>(sendCount[me]) * es, cudaMemcpyDeviceToDevice, s);
    if (copied != cudaSuccess) {
      fail<CollectiveError>("[rank {}/{}] nccl: copying this rank's own block: {}", rank_, size_, cudaText(copied));
    }
  }
  ncclResult_t r = ncclGroupStart();
  if (r != ncclSuccess) return r;
  for (int p = 0; p < size_ && r == ncclSuccess; ++p) {
    const auto q = static_cast<size_t>(p);
    if (p == rank_) continue;
    if (sendCount[q] > 0) r = ncclSend(in + sendAt[q] * es, static_cast<size_t>(sendCount[q]), type, p, impl_->comm, s);
    if (r == ncclSuccess && recvCount[q] > 0) {
      r = ncclRecv(out + recvAt[q] * es, static_cast<size_t>(recvCount[q]), type, p, impl_->comm, s);
    }
  }
  const ncclResult_t ended = ncclGroupEnd();
  return r != ncclSuccess ? r : ended;
}

WorkPtr ProcessGroupNccl::alltoall(const at::Tensor& input, at::Tensor& output, const std::vector<int64_t>& inputSplits,
                                   const std::vector<int64_t>& outputSplits, const AlltoallOptions& opts) {
  const AlltoallSplits splits = checkAlltoall(rank_, size_, input, output, inputSplits, outputSplits);
  checkOwnRows(rank_, size_, splits);
  const BlockCounts blocks = alltoallBlocks(splits);
  const at::ScalarType dtype = input.scalar_type();
  return launch("alltoall", input, output, Flow::OutOfPlace, resolveTimeout(opts.timeout), tensorSummary(input),
                [&](void* send, void* recv, void* stream) { return issueBlocks(send, recv, stream, dtype, blocks); });
}

WorkPtr ProcessGroupNccl::gather(const at::Tensor& input, at::Tensor& output, const GatherOptions& opts) {
  checkGather(rank_, size_, input, output, opts.root);
  const BlockCounts blocks = gatherBlocks(rank_, size_, opts.root, input.numel());
  const bool isRoot = rank_ == opts.root;
  const at::ScalarType dtype = input.scalar_type();
  const std::string summary = tensorSummary(input, fmt::format("root {}", opts.root));
  const auto issue = [&](void* send, void* recv, void* stream) {
    return issueBlocks(send, recv, stream, dtype, blocks);
  };
  // Off the root nothing is received: the input stands in for the output.
  if (!isRoot) return launch("gather", input, input, Flow::SendOnly, resolveTimeout(opts.timeout), summary, issue);
  return launch("gather", input, output, Flow::OutOfPlace, resolveTimeout(opts.timeout), summary, issue);
}

WorkPtr ProcessGroupNccl::scatter(const at::Tensor& input, at::Tensor& output, const ScatterOptions& opts) {
  checkScatter(rank_, size_, input, output, opts.root);
  const BlockCounts blocks = scatterBlocks(rank_, size_, opts.root, output.numel());
  const bool isRoot = rank_ == opts.root;
  const at::ScalarType dtype = output.scalar_type();
  const std::string summary = tensorSummary(output, fmt::format("root {}", opts.root));
  const auto issue = [&](void* send, void* recv, void* stream) {
    return issueBlocks(send, recv, stream, dtype, blocks);
  };
  // Off the root nothing is sent: the output stands in for the input.
  if (!isRoot) return launch("scatter", output, output, Flow::ReceiveOnly, resolveTimeout(opts.timeout), summary, issue);
  return launch("scatter", input, output, Flow::OutOfPlace, resolveTimeout(opts.timeout), summary, issue);
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
