#include "python/src/c10d_bridge.hpp"

#include <ATen/ATen.h>
#include <ATen/ThreadLocalState.h>
#include <ATen/core/ivalue.h>
#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <cstdio>
#include <cstdlib>
#include <functional>

#include "backends/builtin.hpp"
#include "framework/store/c10d_store.hpp"

namespace ddp::python {

namespace {

[[noreturn]] void raise(const std::string& message) { TORCH_CHECK(false, message); }

// Runs `body`, turning our exceptions into c10::Error (Python's RuntimeError).
template <typename Body>
auto guarded(Body&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const c10::Error&) {
    throw;
  } catch (const std::exception& e) {
    raise(e.what());
  }
}

std::exception_ptr asC10Error(const std::exception_ptr& error) {
  if (!error) return nullptr;
  try {
    std::rethrow_exception(error);
  } catch (const c10::Error&) {
    return error;
  } catch (const std::exception& e) {
    try {
      raise(e.what());
    } catch (...) {
      return std::current_exception();
    }
  } catch (...) {
    try {
      raise("ddp backend: an operation failed with an unknown exception");
    } catch (...) {
      return std::current_exception();
    }
  }
}

// How a tensor of some dtype travels through our backend.
struct Wire {
  at::ScalarType type = at::kFloat;  // the dtype our backend moves
  bool complexPairs = false;         // complex as (real, imag) pairs of `type`
  bool widened = false;              // a narrow integer or bool as int32
};

bool oursMoves(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16 || t == at::kInt ||
         t == at::kLong;
}

Wire wireFor(at::ScalarType type, const char* op) {
  if (oursMoves(type)) return {type, false, false};
  switch (type) {
    case at::kByte:
    case at::kChar:
    case at::kShort:
    case at::kBool: return {at::kInt, false, true};
    case at::kComplexFloat: return {at::kFloat, true, false};
    case at::kComplexDouble: return {at::kDouble, true, false};
    default:
      raise(fmt::format("ddp backend: {} of {} tensors is not supported (it moves float32, float64, float16, "
                        "bfloat16, int64, int32, int16, int8, uint8, bool, complex64 and complex128)",
                        op, c10::toString(type)));
  }
}

// `t` as our backend takes it: a contiguous tensor of the wire's dtype,
// `t` itself (or a view of it) when it already is one, else a copy.
at::Tensor toWire(const at::Tensor& t, const Wire& w) {
  if (w.complexPairs) return at::view_as_real(t.resolve_conj()).contiguous();
  if (w.widened) return t.to(w.type).contiguous();
  return t.contiguous();
}

// A contiguous tensor of `numel` elements of `like`'s dtype, on the wire.
at::Tensor emptyWire(int64_t numel, const at::Tensor& like, const Wire& w) {
  return at::empty({w.complexPairs ? 2 * numel : numel}, like.options().dtype(w.type));
}

int64_t wireNumel(int64_t numel, const Wire& w) { return w.complexPairs ? 2 * numel : numel; }

// Copies the first dst.numel() elements of flat `wire` (from element
// `offset` of dst's dtype) into dst, in dst's dtype.
void fromWire(const at::Tensor& wire, int64_t offset, at::Tensor& dst, const Wire& w) {
  const int64_t n = dst.numel();
  at::Tensor flat = wire.reshape({-1}).narrow(0, wireNumel(offset, w), wireNumel(n, w));
  if (w.complexPairs) {
    std::vector<int64_t> shape(dst.sizes().begin(), dst.sizes().end());
    shape.push_back(2);
    dst.copy_(at::view_as_complex(flat.view(shape)));
  } else {
    dst.copy_(flat.view(dst.sizes()));
  }
}

ReduceOp reduceOpFor(const c10d::ReduceOp& op, at::ScalarType type, const char* name) {
  const auto kind = static_cast<c10d::ReduceOp::RedOpType>(op);
  const bool complex = type == at::kComplexFloat || type == at::kComplexDouble;
  ReduceOp ours;
  switch (kind) {
    case c10d::ReduceOp::SUM: ours = ReduceOp::Sum; break;
    case c10d::ReduceOp::AVG: ours = ReduceOp::Avg; break;
    case c10d::ReduceOp::PRODUCT: ours = ReduceOp::Product; break;
    case c10d::ReduceOp::MIN: ours = ReduceOp::Min; break;
    case c10d::ReduceOp::MAX: ours = ReduceOp::Max; break;
    default: {
      const char* names[] = {"SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM", "UNUSED"};
      raise(fmt::format("ddp backend: {} with ReduceOp.{} is not supported; use SUM, AVG, PRODUCT, MIN or MAX", name,
                        static_cast<unsigned>(kind) < 10 ? names[kind] : "?"));
    }
  }
  if (complex && ours != ReduceOp::Sum && ours != ReduceOp::Avg) {
    raise(fmt::format("ddp backend: {} of {} tensors with ReduceOp.{} is not supported (complex numbers reduce "
                      "with SUM or AVG only)",
                      name, c10::toString(type), reduceOpName(ours)));
  }
  if (type == at::kBool) {
    if (ours == ReduceOp::Avg) raise(fmt::format("ddp backend: {} of bool tensors with ReduceOp.AVG is not supported", name));
    // Or and and, through 0/1 in int32.
    if (ours == ReduceOp::Sum) ours = ReduceOp::Max;
    if (ours == ReduceOp::Product) ours = ReduceOp::Min;
  }
  return ours;
}

Milliseconds timeoutOf(std::chrono::milliseconds t) { return t.count() > 0 ? t : kUseGroupTimeout; }

const at::Tensor& single(std::vector<at::Tensor>& tensors, const char* op) {
  if (tensors.size() != 1) {
    raise(fmt::format("ddp backend: {} takes one tensor per rank, got a list of {} (lists of one tensor per device "
                      "are not supported)",
                      op, tensors.size()));
  }
  return tensors[0];
}

void requireSameKind(const std::vector<at::Tensor>& list, const at::Tensor& like, const char* op, const char* what) {
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i].scalar_type() != like.scalar_type() || list[i].numel() != like.numel()) {
      raise(fmt::format("ddp backend: {}: {}[{}] is {} x {}, but the input is {} x {}", op, what, i, list[i].numel(),
                        c10::toString(list[i].scalar_type()), like.numel(), c10::toString(like.scalar_type())));
    }
  }
}

void requireCount(const std::vector<at::Tensor>& list, size_t count, const char* op, const char* what) {
  if (list.size() != count) {
    raise(fmt::format("ddp backend: {}: {} holds {} tensors; it must hold one per rank ({})", op, what, list.size(),
                      count));
  }
}

// c10d's handle over one of our Works.
class BridgeWork : public c10d::Work {
 public:
  // `op`: our operation; `after` (may be empty) copies its results back
  // into the caller's tensors; `outputs`: what result() and the future hold.
  BridgeWork(int rank, c10d::OpType type, WorkPtr op, std::function<void()> after, std::vector<at::Tensor> outputs)
      : c10d::Work(rank, type),
        op_(op),
        done_(after ? thenWork(op, std::chrono::minutes(1), std::move(after)) : op),
        outputs_(std::move(outputs)),
        future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {
    ddp::Work* done = done_.get();
    done_->onFinish([done, future = future_, outputs = outputs_] {
      // The future runs its callbacks here; one that throws must not end
      // the backend's thread or skip the Work's other callbacks.
      try {
        if (auto error = done->exception()) {
          future->setError(asC10Error(error));
        } else {
          future->markCompleted(c10::IValue(outputs));
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr, "ddp_torch: a callback on %s's future failed: %s\n", done->description().c_str(),
                     e.what());
      }
    });
  }

  bool isCompleted() override { return done_->isCompleted() && future_->completed(); }
  bool isSuccess() const override { return done_->isSuccess(); }
  std::exception_ptr exception() const override { return asC10Error(done_->exception()); }
  int sourceRank() const override { return op_->sourceRank(); }
  std::vector<at::Tensor> result() override { return outputs_; }
  void synchronize() override {}

  bool wait(std::chrono::milliseconds timeout) override {
    guarded([&] {
      if (timeout.count() > 0) {
        op_->wait(timeout);
      } else {
        op_->wait();  // up to the operation's own timeout
      }
      done_->wait(std::chrono::minutes(1));  // then its copy back, which follows at once
    });
    future_->wait();  // its completion runs right after done_'s
    return true;
  }

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  WorkPtr op_;
  WorkPtr done_;
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// `after` runs on whichever thread completes the operation, with the
// caller's thread-local state (inference mode, grad mode), as the caller's
// own copy would.
c10::intrusive_ptr<c10d::Work> bridged(int rank, c10d::OpType type, WorkPtr op, std::function<void()> after,
                                       std::vector<at::Tensor> outputs) {
  if (after) {
    after = [state = at::ThreadLocalState(), after = std::move(after)] {
      at::ThreadLocalStateGuard guard(state);
      after();
    };
  }
  return c10::make_intrusive<BridgeWork>(rank, type, std::move(op), std::move(after), std::move(outputs));
}

// The host peers reach for the network interface: MASTER_ADDR, else the
// TCPStore's host under torch.distributed's PrefixStores (init_method
// "tcp://HOST:PORT" sets no MASTER_ADDR), else "" (loopback: one host).
std::string masterAddressOf(c10::intrusive_ptr<c10d::Store> store) {
  if (const char* master = std::getenv("MASTER_ADDR"); master != nullptr && *master) return master;
  for (int depth = 0; store && depth < 8; ++depth) {
    if (auto* tcp = dynamic_cast<c10d::TCPStore*>(store.get())) return tcp->getHost();
    auto* prefix = dynamic_cast<c10d::PrefixStore*>(store.get());
    if (!prefix) break;
    store = prefix->getUnderlyingStore();
  }
  return "";
}

// The tensors on the wire, laid end to end (one flat tensor).
at::Tensor flatWire(const std::vector<at::Tensor>& tensors, const Wire& w) {
  std::vector<at::Tensor> flat;
  for (const auto& t : tensors) flat.push_back(toWire(t, w).reshape({-1}));
  return at::cat(flat);
}

// The copy back of flat `wire` into `dsts`, laid end to end in it.
std::function<void()> copyBackEach(const at::Tensor& wire, const std::vector<at::Tensor>& dsts, const Wire& w) {
  return [wire, dsts = std::vector<at::Tensor>(dsts), w]() mutable {
    int64_t offset = 0;
    for (auto& t : dsts) {
      fromWire(wire, offset, t, w);
      offset += t.numel();
    }
  };
}

// The copy back of `wire` into `dst` when they are not the same memory.
std::function<void()> copyBack(const at::Tensor& wire, const at::Tensor& dst, const Wire& w) {
  if (wire.is_alias_of(dst)) return {};
  at::Tensor target = dst;
  return [wire, target, w]() mutable { fromWire(wire, 0, target, w); };
}

}  // namespace

c10::intrusive_ptr<c10d::ProcessGroup> C10dBridge::create(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                           int size, std::chrono::milliseconds timeout,
                                                           const std::string& backend) {
  return guarded([&] {
    auto ours = std::make_shared<C10dStore>(store, "torch.distributed's store", timeout);
    ProcessGroupOptions options;
    options.timeout = timeout;
    options.masterAddr = masterAddressOf(store);
    return c10::intrusive_ptr<c10d::ProcessGroup>(
        c10::make_intrusive<C10dBridge>(builtinBackends().create(backend, ours, rank, size, options)));
  });
}

C10dBridge::C10dBridge(ProcessGroupPtr group) : c10d::ProcessGroup(group->rank(), group->size()), group_(std::move(group)) {
  init();
}

c10::intrusive_ptr<c10d::Work> C10dBridge::broadcast(std::vector<at::Tensor>& tensors,
                                                     const c10d::BroadcastOptions& opts) {
  return guarded([&] {
    const at::Tensor& t = single(tensors, "broadcast");
    const Wire w = wireFor(t.scalar_type(), "broadcast");
    at::Tensor wire = toWire(t, w);
    ++issued_;
    auto op = group_->broadcast(wire, {static_cast<int>(opts.rootRank), timeoutOf(opts.timeout)});
    return bridged(rank_, c10d::OpType::BROADCAST, op, copyBack(wire, t, w), tensors);
  });
}

c10::intrusive_ptr<c10d::Work> C10dBridge::allreduce(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceOptions& opts) {
  return guarded([&] {
    const at::Tensor& t = single(tensors, "allreduce");
    const ReduceOp op = reduceOpFor(opts.reduceOp, t.scalar_type(), "allreduce");
    const Wire w = wireFor(t.scalar_type(), "allreduce");
    at::Tensor wire = toWire(t, w);
    ++issued_;
    auto work = group_->allreduce(wire, {op, timeoutOf(opts.timeout)});
    return bridged(rank_, c10d::OpType::ALLREDUCE, work, copyBack(wire, t, w), tensors);
  });
}

// One allreduce of the tensors laid end to end (one dtype), split back.
c10::intrusive_ptr<c10d::Work> C10dBridge::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                               const c10d::AllreduceCoalescedOptions& opts) {
  return guarded([&] {
    if (tensors.empty()) raise("ddp backend: allreduce_coalesced of an empty list");
    const at::Tensor& first = tensors[0];
    for (size_t i = 1; i < tensors.size(); ++i) {
      if (tensors[i].scalar_type() != first.scalar_type()) {
        raise(fmt::format("ddp backend: allreduce_coalesced: tensor {} is {}, tensor 0 {}; coalesced tensors share "
                          "one dtype",
                          i, c10::toString(tensors[i].scalar_type()), c10::toString(first.scalar_type())));
      }
    }
    const ReduceOp op = reduceOpFor(opts.reduceOp, first.scalar_type(), "allreduce_coalesced");
    const Wire w = wireFor(first.scalar_type(), "allreduce_coalesced");
    at::Tensor wire = flatWire(tensors, w);
    ++issued_;
    auto work = group_->allreduce(wire, {op, timeoutOf(opts.timeout)});
    return bridged(rank_, c10d::OpType::ALLREDUCE_COALESCED, work, copyBackEach(wire, tensors, w), tensors);
  });
}

c10::intrusive_ptr<c10d::Work> C10dBridge::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  return guarded([&] {
    const at::Tensor& t = single(tensors, "reduce");
    const ReduceOp op = reduceOpFor(opts.reduceOp, t.scalar_type(), "reduce");
    const Wire w = wireFor(t.scalar_type(), "reduce");
    at::Tensor wire = toWire(t, w);
    ++issued_;
    auto work = group_->reduce(wire, {static_cast<int>(opts.rootRank), op, timeoutOf(opts.timeout)});
    return bridged(rank_, c10d::OpType::REDUCE, work, copyBack(wire, t, w), tensors);
  });
}

c10::intrusive_ptr<c10d::Work> C10dBridge::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) {
  return guarded([&] {
    const at::Tensor& in = single(inputs, "allgather");
    if (outputs.size() != 1) raise(fmt::format("ddp backend: allgather takes one output list, got {}", outputs.size()));
    auto& outs = outputs[0];
    requireCount(outs, size_, "allgather", "the output list");
    requireSameKind(outs, in, "allgather", "output");
    const Wire w = wireFor(in.scalar_type(), "allgather");
    at::Tensor wireIn = toWire(in, w);
    at::Tensor wireOut = emptyWire(size_ * in.numel(), in, w);
    ++issued_;
    auto work = group_->allgather(wireIn.reshape({-1}), wireOut, {timeoutOf(opts.timeout)});
    return bridged(rank_, c10d::OpType::ALLGATHER, work, copyBackEach(wireOut, outs, w), outs);
  });
}

c10::intrusive_ptr<c10d::Work> C10dBridge::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                           const c10d::AllgatherOptions& opts) {
  return guarded([&] {
    if (output.scalar_type() != input.scalar_type() || output.numel() != size_ * input.numel()) {
      raise(fmt::format("ddp backend: _allgather_base: the output is {} x {}; it must be {} x {} (world size x the "
                        "input's count)",
                        output.numel(), c10::toString(output.scalar_type()), size_ * input.numel(),
                        c10::toString(input.scalar_type())));
    }
    const Wire w = wireFor(input.scalar_type(), "_allgather_base");
    at::Tensor wireIn = toWire(input, w).reshape({-1});
    at::Tensor wireOut = toWire(output, w).reshape({-1});
    ++issued_;
    auto work = group_->allgather(wireIn, wireOut, {timeoutOf(opts.timeout)});
    return bridged(rank_, c10d::OpType::_ALLGATHER_BASE, work, copyBack(wireOut, output, w), {output});
  });
}

c10::intrusive_ptr<c10d::Work> C10dBridge::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                  std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  return guarded([&] {
    const at::Tensor& in = single(inputs, "gather");
    const int root = static_cast<int>(opts.rootRank);
    const Wire w = wireFor(in.scalar_type(), "gather");
    at::Tensor wireIn = toWire(in, w).reshape({-1});
    at::Tensor wireOut;
    std::vector<at::Tensor> outs;
    if (rank_ == root) {
      if (outputs.size() != 1) raise(fmt::format("ddp backend: gather's root takes one output list, got {}", outputs.size()));
      outs = outputs[0];
      requireCount(outs, size_, "gather", "the root's output list");
      requireSameKind(outs, in, "gather", "output");
      wireOut = emptyWire(size_ * in.numel(), in, w);
    } else if (!outputs.empty() && !outputs[0].empty()) {
      raise(fmt::format("ddp backend: gather: rank {} is not the root ({}) and must pass no output list", rank_, root));
    }
    ++issued_;
    auto work = group_->gather(wireIn, wireOut, {root, timeoutOf(opts.timeout)});
    return bridged(rank_, c10d::OpType::GATHER, work, rank_ == root ? copyBackEach(wireOut, outs, w) : nullptr,
                   outs);
  });
}

c10::intrusive_ptr<c10d::Work> C10dBridge::scatter(std::vector<at::Tensor>& outputs,
                                                   std::vector<std::vector<at::Tensor>>& inputs,
                                                   const c10d::ScatterOptions& opts) {
  return guarded([&] {
    at::Tensor out = single(outputs, "scatter");
    const int root = static_cast<int>(opts.rootRank);
    const Wire w = wireFor(out.scalar_type(), "scatter");
    at::Tensor wireIn;
    if (rank_ == root) {
      if (inputs.size() != 1) raise(fmt::format("ddp backend: scatter's root takes one input list, got {}", inputs.size()));
      requireCount(inputs[0], size_, "scatter", "the root's input list");
      requireSameKind(inputs[0], out, "scatter", "input");
      wireIn = flatWire(inputs[0], w);
    } else if (!inputs.empty() && !inputs[0].empty()) {
      raise(fmt::format("ddp backend: scatter: rank {} is not the root ({}) and must pass no input list", rank_, root));
    }
    at::Tensor wireOut = toWire(out, w).reshape({-1});
    ++issued_;
    auto work = group_->scatter(wireIn, wireOut, {root, timeoutOf(opts.timeout)});
    return bridged(rank_, c10d::OpType::SCATTER, work, copyBack(wireOut, out, w), outputs);
  });
}

c10::intrusive_ptr<c10d::Work> C10dBridge::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                          std::vector<std::vector<at::Tensor>>& inputs,
                                                          const c10d::ReduceScatterOptions& opts) {
  return guarded([&] {
    at::Tensor out = single(outputs, "reduce_scatter");
    if (inputs.size() != 1) raise(fmt::format("ddp backend: reduce_scatter takes one input list, got {}", inputs.size()));
    requireCount(inputs[0], size_, "reduce_scatter", "the input list");
    requireSameKind(inputs[0], out, "reduce_scatter", "input");
    const ReduceOp op = reduceOpFor(opts.reduceOp, out.scalar_type(), "reduce_scatter");
    const Wire w = wireFor(out.scalar_type(), "reduce_scatter");
    at::Tensor wireIn = flatWire(inputs[0], w);
    at::Tensor wireOut = toWire(out, w).reshape({-1});
    ++issued_;
    auto work = group_->reduceScatter(wireIn, wireOut, {op, timeoutOf(opts.timeout)});
    return bridged(rank_, c10d::OpType::REDUCE_SCATTER, work, copyBack(wireOut, out, w), outputs);
  });
}

c10::intrusive_ptr<c10d::Work> C10dBridge::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                const c10d::ReduceScatterOptions& opts) {
  return guarded([&] {
    if (output.scalar_type() != input.scalar_type() || input.numel() != size_ * output.numel()) {
      raise(fmt::format("ddp backend: _reduce_scatter_base: the input is {} x {}; it must be {} x {} (world size x "
                        "the output's count)",
                        input.numel(), c10::toString(input.scalar_type()), size_ * output.numel(),
                        c10::toString(output.scalar_type())));
    }
    const ReduceOp op = reduceOpFor(opts.reduceOp, output.scalar_type(), "_reduce_scatter_base");
    const Wire w = wireFor(output.scalar_type(), "_reduce_scatter_base");
    at::Tensor wireIn = toWire(input, w).reshape({-1});
    at::Tensor wireOut = toWire(output, w).reshape({-1});
    ++issued_;
    auto work = group_->reduceScatter(wireIn, wireOut, {op, timeoutOf(opts.timeout)});
    return bridged(rank_, c10d::OpType::_REDUCE_SCATTER_BASE, work, copyBack(wireOut, output, w), {output});
  });
}

c10::intrusive_ptr<c10d::Work> C10dBridge::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                         std::vector<int64_t>& outputSplits,
                                                         std::vector<int64_t>& inputSplits,
                                                         const c10d::AllToAllOptions& opts) {
  return guarded([&] {
    if (output.scalar_type() != input.scalar_type()) {
      raise(fmt::format("ddp backend: alltoall_base: the input is {} and the output {}",
                        c10::toString(input.scalar_type()), c10::toString(output.scalar_type())));
    }
    const Wire w = wireFor(input.scalar_type(), "alltoall_base");
    at::Tensor wireIn = toWire(input, w);
    at::Tensor wireOut = toWire(output, w);
    ++issued_;
    auto work = group_->alltoall(wireIn, wireOut, inputSplits, outputSplits, {timeoutOf(opts.timeout)});
    return bridged(rank_, c10d::OpType::ALLTOALL_BASE, work, copyBack(wireOut, output, w), {output});
  });
}

// Tensors of any shapes: laid end to end, one element a row.
c10::intrusive_ptr<c10d::Work> C10dBridge::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                    const c10d::AllToAllOptions& opts) {
  return guarded([&] {
    requireCount(inputs, size_, "alltoall", "the input list");
    requireCount(outputs, size_, "alltoall", "the output list");
    const at::ScalarType type = inputs[0].scalar_type();
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (inputs[i].scalar_type() != type || outputs[i].scalar_type() != type) {
        raise(fmt::format("ddp backend: alltoall: every input and output must be {} (as input 0); input {} is {}, "
                          "output {} is {}",
                          c10::toString(type), i, c10::toString(inputs[i].scalar_type()), i,
                          c10::toString(outputs[i].scalar_type())));
      }
    }
    const Wire w = wireFor(type, "alltoall");
    std::vector<int64_t> sendSplits, recvSplits;
    int64_t total = 0;
    for (int j = 0; j < size_; ++j) {
      sendSplits.push_back(wireNumel(inputs[j].numel(), w));
      recvSplits.push_back(wireNumel(outputs[j].numel(), w));
      total += outputs[j].numel();
    }
    at::Tensor wireIn = flatWire(inputs, w);
    at::Tensor wireOut = emptyWire(total, inputs[0], w);
    ++issued_;
    auto work = group_->alltoall(wireIn, wireOut, sendSplits, recvSplits, {timeoutOf(opts.timeout)});
    return bridged(rank_, c10d::OpType::ALLTOALL, work, copyBackEach(wireOut, outputs, w), outputs);
  });
}

c10::intrusive_ptr<c10d::Work> C10dBridge::send(std::vector<at::Tensor>& tensors, int dstRank, int tag) {
  return guarded([&] {
    const at::Tensor& t = single(tensors, "send");
    const Wire w = wireFor(t.scalar_type(), "send");
    at::Tensor wire = toWire(t, w);
    ++issued_;
    auto work = group_->send(wire, dstRank, {tag, kUseGroupTimeout});
    return bridged(rank_, c10d::OpType::SEND, work, {}, tensors);
  });
}

c10::intrusive_ptr<c10d::Work> C10dBridge::recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) {
  return guarded([&] {
    const at::Tensor& t = single(tensors, srcRank == kAnySourceRank ? "recvAnysource" : "recv");
    const Wire w = wireFor(t.scalar_type(), "recv");
    at::Tensor wire = toWire(t, w);
    ++issued_;
    auto work = group_->recv(wire, srcRank, {tag, kUseGroupTimeout});
    return bridged(rank_, srcRank == kAnySourceRank ? c10d::OpType::RECVANYSOURCE : c10d::OpType::RECV, work,
                   copyBack(wire, t, w), tensors);
  });
}

c10::intrusive_ptr<c10d::Work> C10dBridge::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  return recv(tensors, kAnySourceRank, tag);
}

c10::intrusive_ptr<c10d::Work> C10dBridge::barrier(const c10d::BarrierOptions& opts) {
  return guarded([&] {
    ++issued_;
    return bridged(rank_, c10d::OpType::BARRIER, group_->barrier({timeoutOf(opts.timeout)}), {}, {});
  });
}

// A barrier waited for here; our barrier's error names the ranks missing.
void C10dBridge::monitoredBarrier(const c10d::BarrierOptions& opts, bool /*waitAllRanks*/) {
  barrier(opts)->wait(std::chrono::milliseconds(0));
}

}  // namespace ddp::python
