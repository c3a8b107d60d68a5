#include "plugins/comm_hooks/powersgd_hook.hpp"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <vector>

#include "framework/core/errors.hpp"

namespace ddp::plugins {
namespace {

// One compressed gradient: its place in the bucket and in the packed
// buffers, and its Q (kept across steps).
struct Matrix {
  int64_t offset = 0, rows = 0, cols = 0;
  int64_t pOffset = 0;  // in the first packed buffer, after the exact part
  int64_t qOffset = 0;  // in the second
  at::Tensor q;         // cols x rank
  uint64_t seed = 0;    // of its starting Q, the same on every rank
};

// A gradient averaged exactly: its place in the bucket and in the first
// packed buffer.
struct Exact {
  int64_t offset = 0, numel = 0, packedOffset = 0;
};

struct Layout {
  std::vector<Matrix> matrices;
  std::vector<Exact> exact;
  int64_t firstNumel = 0;   // the exact part, then every P
  int64_t secondNumel = 0;  // every Q
};

Layout planLayout(const std::vector<at::Tensor>& parameters, const PowerSgdHook::Options& o) {
  Layout layout;
  int64_t offset = 0, exactNumel = 0;
  std::vector<std::pair<int64_t, int64_t>> matrices;  // (offset, index into parameters)
  for (size_t i = 0; i < parameters.size(); ++i) {
    const at::Tensor& p = parameters[i];
    const int64_t numel = p.numel();
    bool compress = false;
    if (p.dim() >= 2 && numel > 0) {
      const int64_t rows = p.size(0), cols = numel / rows;
      compress = static_cast<double>(rows) * static_cast<double>(cols) >=
                 o.minCompressionRate * static_cast<double>(o.rank) * static_cast<double>(rows + cols);
      if (compress) {
        Matrix m;
        m.offset = offset;
        m.rows = rows;
        m.cols = cols;
        layout.matrices.push_back(m);
      }
    }
    if (!compress) {
      layout.exact.push_back({offset, numel, exactNumel});
      exactNumel += numel;
    }
    offset += numel;
  }
  layout.firstNumel = exactNumel;
  for (Matrix& m : layout.matrices) {
    m.pOffset = layout.firstNumel;
    layout.firstNumel += m.rows * o.rank;
    m.qOffset = layout.secondNumel;
    layout.secondNumel += m.cols * o.rank;
  }
  return layout;
}

// Columns of `m` (n x r) made orthonormal in place: Gram-Schmidt, each
// column projected off the earlier ones twice (once leaves rounding
// error's worth of them). A column that is zero, or depends on the earlier
// ones to rounding, becomes zero, not noise scaled up to length 1.
void orthogonalize(at::Tensor m) {
  const int64_t r = m.size(1);
  for (int64_t i = 0; i < r; ++i) {
    at::Tensor col = m.narrow(1, i, 1);
    const double before = col.norm().item<double>();
    if (i > 0) {
      at::Tensor earlier = m.narrow(1, 0, i);
      for (int pass = 0; pass < 2; ++pass) col.sub_(at::mm(earlier, at::mm(earlier.t(), col)));
    }
    const double after = col.norm().item<double>();
    if (std::isfinite(after) && after > 0 && after > 1e-6 * before) {
      col.div_(after);
    } else {
      col.zero_();
    }
  }
}

// The same pseudo-random numbers in [-1, 1) on every rank (splitmix64).
at::Tensor startingQ(int64_t cols, int64_t rank, uint64_t seed, const at::TensorOptions& options) {
  at::Tensor q = at::empty({cols, rank}, at::TensorOptions().dtype(at::kDouble));
  double* out = q.data_ptr<double>();
  uint64_t state = seed;
  for (int64_t i = 0; i < cols * rank; ++i) {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    out[i] = static_cast<double>(z >> 11) / static_cast<double>(1ull << 52) - 1.0;
  }
  q = q.to(options);
  orthogonalize(q);
  return q;
}

void failOnce(const WorkPtr& done, std::exception_ptr error) {
  if (done && !done->isCompleted()) done->finish(std::move(error));
}

// A collective's Work, or one that has already failed with what the call
// threw: the steps that wait for it must see it complete either way.
template <typename Call>
WorkPtr issueOrFail(const std::string& what, Milliseconds timeout, Call call) {
  try {
    return call();
  } catch (...) {
    auto failed = std::make_shared<Work>(what, timeout);
    failed->finish(std::current_exception());
    return failed;
  }
}

}  // namespace

struct PowerSgdHook::Impl {
  struct Bucket {
    Layout layout;
    at::Tensor error;          // this rank's input (with feedback), then what compression lost
    at::Tensor first, second;  // packed: exact part and Ps; Qs
  };
  // A collective to issue, once `after` (if set) has been issued and has
  // completed.
  struct Step {
    std::shared_ptr<WorkPtr> after;
    std::function<void()> issue;
    WorkPtr done;  // the bucket's Work: failed if issue() throws
  };

  explicit Impl(Options o) : options(o) {}

  Options options;
  std::mutex mutex;  // everything below
  std::map<size_t, Bucket> buckets;
  int64_t steps = 0;
  std::deque<Step> queue;
  bool pumping = false, again = false;

  // Issues the queued collectives whose predecessors are done, in order.
  // Re-entrant calls (a collective that completes inside issue()) only
  // ask the running pump to look again.
  void pump() {
    std::unique_lock<std::mutex> lock(mutex);
    if (pumping) {
      again = true;
      return;
    }
    pumping = true;
    do {
      again = false;
      while (!queue.empty()) {
        const Step& front = queue.front();
        if (front.after && !(*front.after && (*front.after)->isCompleted())) break;
        Step step = std::move(queue.front());
        queue.pop_front();
        lock.unlock();
        try {
          step.issue();
        } catch (...) {
          failOnce(step.done, std::current_exception());
        }
        lock.lock();
      }
    } while (again);
    pumping = false;
  }

  void enqueue(std::vector<Step> steps) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      for (Step& s : steps) queue.push_back(std::move(s));
    }
    pump();
  }

  Bucket& bucketFor(size_t index, const at::Tensor& buffer, const std::vector<at::Tensor>& parameters) {
    Bucket& b = buckets[index];
    if (!b.error.defined() || b.error.numel() != buffer.numel()) {
      b.layout = planLayout(parameters, options);
      b.error = at::zeros({buffer.numel()}, buffer.options());
      b.first = at::empty({b.layout.firstNumel}, buffer.options());
      b.second = at::empty({b.layout.secondNumel}, buffer.options());
      for (size_t i = 0; i < b.layout.matrices.size(); ++i) {
        Matrix& m = b.layout.matrices[i];
        m.seed = 0x5eed0000ull + 7919ull * index + i;
        m.q = startingQ(m.cols, options.rank, m.seed, buffer.options());
      }
    }
    return b;
  }
};

PowerSgdHook::PowerSgdHook(Options options) : impl_(std::make_shared<Impl>(options)) {
  if (options.rank < 1) fail<UsageError>("comm_hook.powersgd: rank must be >= 1, got {}", options.rank);
  if (options.startSteps < 0) fail<UsageError>("comm_hook.powersgd: start_steps must be >= 0, got {}", options.startSteps);
  DDP_CHECK(options.timeout.count() > 0, "PowerSgdHook: the timeout must be given");
}

PowerSgdHook::~PowerSgdHook() = default;

PowerSgdHook::Sizes PowerSgdHook::sizesFor(const std::vector<at::Tensor>& parameters, const Options& options) {
  const Layout layout = planLayout(parameters, options);
  Sizes s;
  s.compressed = layout.firstNumel + layout.secondNumel;
  for (const at::Tensor& p : parameters) s.uncompressed += p.numel();
  return s;
}

WorkPtr PowerSgdHook::run(ProcessGroup& group, GradBucket& bucket) {
  const Options& o = impl_->options;
  auto done = std::make_shared<Work>(
      fmt::format("[rank {}/{}] powersgd bucket {} ({} x {})", group.rank(), group.size(), bucket.index,
                  bucket.buffer.numel(), dtypeName(bucket.buffer)),
      o.timeout);
  ProcessGroup* g = &group;  // DDP keeps the group alive while its buckets' Works run
  at::Tensor buffer = bucket.buffer;
  const double world = static_cast<double>(group.size());
  auto finishWith = [done](const WorkPtr& w) { done->finish(w->exception()); };

  bool exact = false;
  Impl::Bucket* state = nullptr;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    if (bucket.index == 0) ++impl_->steps;
    const bool floating = buffer.scalar_type() == at::kFloat || buffer.scalar_type() == at::kDouble;
    exact = impl_->steps <= o.startSteps || !floating;
    if (!exact) {
      state = &impl_->bucketFor(bucket.index, buffer, bucket.parameters);
      exact = state->layout.matrices.empty();
    }
  }
  if (exact) {
    impl_->enqueue({{nullptr, [g, buffer, done, o, finishWith]() mutable {
                       AllreduceOptions opts;
                       opts.op = ReduceOp::Avg;
                       opts.timeout = o.timeout;
                       WorkPtr w = g->allreduce(buffer, opts);
                       w->onFinish([w, finishWith] { finishWith(w); });
                     },
                     done}});
    return done;
  }

  // Stage 1, here: error feedback, P = M Q, the exact part packed beside the Ps.
  Impl::Bucket& b = *state;
  {
    at::NoGradGuard noGrad;
    // error becomes this step's input M (gradient + last step's loss; the
    // exact parts' error is zero), in one pass; the bucket is rewritten
    // from the results.
    b.error.add_(buffer);
    for (const Exact& e : b.layout.exact) {
      b.first.narrow(0, e.packedOffset, e.numel).copy_(b.error.narrow(0, e.offset, e.numel));
    }
    for (const Matrix& m : b.layout.matrices) {
      at::Tensor p = b.first.narrow(0, m.pOffset, m.rows * o.rank).view({m.rows, o.rank});
      at::mm_out(p, b.error.narrow(0, m.offset, m.rows * m.cols).view({m.rows, m.cols}), m.q);
    }
  }
  AllreduceOptions sum;
  sum.op = ReduceOp::Sum;
  sum.timeout = o.timeout;
  auto firstWork = std::make_shared<WorkPtr>();
  const std::string what = done->description();
  // The callbacks hold the state (self) until the last collective is done,
  // whatever happens to the hook.
  std::shared_ptr<Impl> self = impl_;
  Impl::Step first{nullptr,
                   [g, self, &b, sum, firstWork, what, o] {
                     *firstWork = issueOrFail(what + " (P)", o.timeout, [&] { return g->allreduce(b.first, sum); });
                     (*firstWork)->onFinish([self] { self->pump(); });
                   },
                   done};
  // Stage 2, once the Ps are summed: the exact part averaged into the
  // bucket, the Ps orthogonalized, Q = M^T P summed. The Q allreduce is
  // issued whatever went wrong before it on this rank, so that every rank
  // issues the same collectives; the bucket then fails with the first error.
  Impl::Step second{
      firstWork,
      [g, self, &b, buffer, world, sum, firstWork, done, what, o]() mutable {
        std::exception_ptr error = (*firstWork)->exception();
        if (!error) {
          try {
            at::NoGradGuard noGrad;
            for (const Exact& e : b.layout.exact) {
              buffer.narrow(0, e.offset, e.numel).copy_(b.first.narrow(0, e.packedOffset, e.numel)).div_(world);
            }
            for (const Matrix& m : b.layout.matrices) {
              at::Tensor p = b.first.narrow(0, m.pOffset, m.rows * o.rank).view({m.rows, o.rank});
              orthogonalize(p);
              at::Tensor mine = b.error.narrow(0, m.offset, m.rows * m.cols).view({m.rows, m.cols});
              at::Tensor q = b.second.narrow(0, m.qOffset, m.cols * o.rank).view({m.cols, o.rank});
              at::mm_out(q, mine.t(), p);
            }
          } catch (...) {
            error = std::current_exception();
          }
        }
        if (error) b.second.zero_();
        WorkPtr qs = issueOrFail(what + " (Q)", o.timeout, [&] { return g->allreduce(b.second, sum); });
        // Stage 3: Q averaged and kept; the bucket becomes P Q^T; the error,
        // what that lost of this rank's input.
        qs->onFinish([qs, self, &b, buffer, world, done, error, o]() mutable {
          std::exception_ptr failure = error ? error : qs->exception();
          if (!failure) {
            try {
              at::NoGradGuard noGrad;
              for (Matrix& m : b.layout.matrices) {
                at::Tensor q = b.second.narrow(0, m.qOffset, m.cols * o.rank).view({m.cols, o.rank});
                q.div_(world);
                at::Tensor p = b.first.narrow(0, m.pOffset, m.rows * o.rank).view({m.rows, o.rank});
                at::Tensor out = buffer.narrow(0, m.offset, m.rows * m.cols).view({m.rows, m.cols});
                at::mm_out(out, p, q.t());
                at::Tensor lost = b.error.narrow(0, m.offset, m.rows * m.cols).view({m.rows, m.cols});
                lost.sub_(out);
                // A column of Q that is zero (a gradient of zeros, an
                // underflow) or not finite would stay so, warm start after
                // warm start: it starts afresh, the same on every rank.
                at::Tensor norms = q.norm(2, {0});
                const at::Tensor bad = norms.isfinite().logical_not().logical_or(norms.eq(0));
                if (bad.any().item<bool>()) {
                  q.copy_(at::where(bad.unsqueeze(0), startingQ(m.cols, o.rank, m.seed, q.options()), q));
                  if (!lost.isfinite().all().item<bool>()) lost.zero_();
                }
                m.q.copy_(q);
              }
              for (const Exact& e : b.layout.exact) b.error.narrow(0, e.offset, e.numel).zero_();
            } catch (...) {
              failure = std::current_exception();
            }
          }
          if (failure) {
            b.error.zero_();  // what this step added is not carried into the next
            failOnce(done, failure);
          } else {
            done->finish();
          }
        });
      },
      done};
  impl_->enqueue({std::move(first), std::move(second)});
  return done;
}

}  // namespace ddp::plugins
