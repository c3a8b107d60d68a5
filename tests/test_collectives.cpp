// Collectives × dtype × world size × element count, against closed forms.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include "framework/errors.hpp"
#include "tests/test_support.hpp"

using namespace ddp;
using ddp::test::joinErrors;
using ddp::test::runRanks;

namespace {

const std::vector<at::ScalarType> kDtypes = {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kInt, at::kLong};
const std::vector<int64_t> kCounts = {0, 1, 7, 1000, 1 << 20};
const std::vector<ReduceOp> kOps = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Min, ReduceOp::Max, ReduceOp::Product};

// 0..6 repeating: every result below stays an exact integer or half-integer
// in every dtype, so comparisons are exact.
at::Tensor pattern(int64_t count) { return at::arange(count, at::kLong).remainder(7); }

at::Tensor expectedReduction(ReduceOp op, const at::Tensor& base, int n) {
  switch (op) {
    case ReduceOp::Sum: return base * n + n * (n + 1) / 2;
    case ReduceOp::Avg: return (base.to(at::kDouble) * n + n * (n + 1) / 2) / n;
    case ReduceOp::Min: return base + 1;
    case ReduceOp::Max: return base + n;
    case ReduceOp::Product: {
      at::Tensor p = at::ones_like(base);
      for (int r = 0; r < n; ++r) p = p * ((base + r).remainder(2) + 1);
      return p;
    }
  }
  return {};
}

// Rank r's input for a reduction: base + r + 1 (product: 1 or 2).
at::Tensor reductionInput(ReduceOp op, const at::Tensor& base, int rank) {
  return op == ReduceOp::Product ? (base + rank).remainder(2) + 1 : base + rank + 1;
}

bool exactlyEqual(const at::Tensor& got, at::Tensor expected, at::ScalarType dtype) {
  if (at::isIntegralType(dtype, false) && expected.is_floating_point()) expected = expected.trunc();
  return got.numel() == expected.numel() &&
         (got.numel() == 0 || at::equal(got.to(at::kDouble).view({-1}), expected.to(at::kDouble).view({-1})));
}

std::string caseName(const char* op, at::ScalarType dtype, int64_t count) {
  return std::string(op) + " " + c10::toString(dtype) + " x" + std::to_string(count);
}

}  // namespace

namespace {

// Every collective x dtype x element count at world size n, on `backend`.
void checkClosedForms(const std::string& backend, int n) {
  std::mutex failuresMutex;
  std::vector<std::string> failures;
  auto fail = [&](int rank, const std::string& what) {
    std::lock_guard<std::mutex> lock(failuresMutex);
    failures.push_back("rank " + std::to_string(rank) + ": " + what);
  };
  ProcessGroupOptions options;
  auto errors = runRanks(backend, n, [&](int rank, ProcessGroup& pg) {
    for (at::ScalarType dtype : kDtypes) {
      for (int64_t count : kCounts) {
        at::Tensor base = pattern(count);
        for (ReduceOp op : kOps) {
          at::Tensor t = reductionInput(op, base, rank).to(dtype);
          pg.allreduce(t, {op})->wait();
          if (!exactlyEqual(t, expectedReduction(op, base, n), dtype))
            fail(rank, caseName("allreduce", dtype, count) + " " + reduceOpName(op));

          at::Tensor rsIn = reductionInput(op, pattern(count * n), rank).to(dtype);
          at::Tensor rsOut = at::empty({count}, dtype);
          pg.reduceScatter(rsIn, rsOut, {op})->wait();
          at::Tensor rsBase = pattern(count * n).narrow(0, rank * count, count);
          if (!exactlyEqual(rsOut, expectedReduction(op, rsBase, n), dtype))
            fail(rank, caseName("reduce_scatter", dtype, count) + " " + reduceOpName(op));
        }
        const int root = n - 1;
        at::Tensor b = (base + rank).to(dtype);
        pg.broadcast(b, {root})->wait();
        if (!exactlyEqual(b, base + root, dtype)) fail(rank, caseName("broadcast", dtype, count));

        at::Tensor gathered = at::empty({n, count}, dtype);
        pg.allgather((base + 10 * rank).to(dtype), gathered)->wait();
        for (int r = 0; r < n; ++r) {
          if (!exactlyEqual(gathered[r], base + 10 * r, dtype)) fail(rank, caseName("allgather", dtype, count));
        }
      }
    }
    pg.barrier()->wait();
  }, options);
  INFO(joinErrors(errors));
  REQUIRE(joinErrors(errors).empty());
  for (const auto& f : failures) FAIL_CHECK(f);
  REQUIRE(failures.empty());
}

}  // namespace

TEMPLATE_TEST_CASE_SIG("gloo collectives match closed forms", "[collectives]", ((int World), World), 1, 2, 3, 4) {
  std::string whyNot;
  if (!ddp::test::backendRunnable("gloo", &whyNot)) {
    WARN("SKIPPED: " << whyNot);
    return;
  }
  checkClosedForms("gloo", World);
}

// NCCL allows one rank per GPU: world size 1, then every GPU count above 1.
// CPU tensors are staged through the device, so the same closed forms hold.
TEST_CASE("nccl collectives match closed forms", "[collectives][nccl]") {
  std::string whyNot;
  if (!ddp::test::backendRunnable("nccl", &whyNot)) {
    WARN("SKIPPED: " << whyNot);
    return;
  }
  const int gpus = ddp::test::cudaDevices();
  for (int n = 1; n <= gpus; ++n) {
    INFO("world size " << n);
    checkClosedForms("nccl", n);
  }
}

TEST_CASE("non-contiguous tensors are staged and written back", "[collectives]") {
  auto errors = runRanks("gloo", 2, [](int rank, ProcessGroup& pg) {
    at::Tensor m = at::full({4, 6}, rank + 1.0f).t();  // a transposed view
    pg.allreduce(m)->wait();
    if (!at::equal(m, at::full({6, 4}, 3.0f))) throw std::runtime_error("non-contiguous allreduce result wrong");
  });
  REQUIRE(joinErrors(errors).empty());
}

TEST_CASE("collectives run asynchronously and in call order", "[collectives]") {
  auto errors = runRanks("gloo", 2, [](int rank, ProcessGroup& pg) {
    std::vector<at::Tensor> tensors;
    std::vector<WorkPtr> works;
    for (int i = 0; i < 20; ++i) {
      tensors.push_back(at::full({1000}, float(i + rank)));
      works.push_back(pg.allreduce(tensors.back()));
    }
    for (int i = 0; i < 20; ++i) {
      works[i]->wait();
      if (!works[i]->isCompleted() || works[i]->exception()) throw std::runtime_error("work not completed");
      if (tensors[i][0].item<float>() != float(2 * i + 1)) throw std::runtime_error("wrong value at " + std::to_string(i));
    }
  });
  REQUIRE(joinErrors(errors).empty());
}

TEST_CASE("a missing rank makes a collective fail within its timeout", "[collectives][errors]") {
  auto start = std::chrono::steady_clock::now();
  auto errors = runRanks("gloo", 2, [](int rank, ProcessGroup& pg) {
    if (rank == 1) return;  // never joins the allreduce
    at::Tensor t = at::ones({1000});
    pg.allreduce(t, {ReduceOp::Sum, std::chrono::milliseconds(1500)})->wait();
  });
  auto elapsed = std::chrono::steady_clock::now() - start;
  REQUIRE(errors[1].empty());
  INFO(errors[0]);
  CHECK(errors[0].find("[rank 0/2]") != std::string::npos);
  CHECK(errors[0].find("gloo allreduce #0") != std::string::npos);
  CHECK(errors[0].find("1000 elements") != std::string::npos);
  CHECK(errors[0].find("timeout 1500 ms") != std::string::npos);
  CHECK(elapsed < std::chrono::seconds(10));
}

TEST_CASE("ranks that disagree fail clearly", "[collectives][errors]") {
  auto errors = runRanks("gloo", 2, [](int rank, ProcessGroup& pg) {
    at::Tensor t = at::ones({rank == 0 ? 10 : 11});
    pg.allreduce(t, {ReduceOp::Sum, std::chrono::milliseconds(5000)})->wait();
  });
  for (int r = 0; r < 2; ++r) {
    INFO(errors[r]);
    CHECK(errors[r].find("does not match rank") != std::string::npos);
    CHECK(errors[r].find("HINT:") != std::string::npos);
  }
}

TEST_CASE("a failed group fails later collectives at once", "[collectives][errors]") {
  auto errors = runRanks("gloo", 2, [](int rank, ProcessGroup& pg) {
    at::Tensor t = at::ones({rank == 0 ? 3 : 4});
    auto first = pg.allreduce(t, {ReduceOp::Sum, std::chrono::milliseconds(5000)});
    auto second = pg.allreduce(t);
    try {
      first->wait();
    } catch (const CollectiveError&) {
    }
    second->wait();
  });
  INFO(joinErrors(errors));
  CHECK(errors[0].find("failed earlier") != std::string::npos);
}

TEST_CASE("the backend registry names what exists", "[registry]") {
  auto store = std::make_shared<HashStore>();
  try {
    BackendRegistry::global().create("glooo", store, 0, 1);
    FAIL("no error for an unknown backend");
  } catch (const UsageError& e) {
    std::string msg = e.what();
    CHECK(msg.find("unknown backend 'glooo'") != std::string::npos);
    CHECK(msg.find("gloo") != std::string::npos);
  }
  BackendRegistry registry;
  registry.add("x", nullptr);
  CHECK_THROWS_WITH(registry.add("x", nullptr), Catch::Contains("registered twice"));
}

namespace {
class MinimalGroup : public ProcessGroup {
 public:
  MinimalGroup() : ProcessGroup(0, 1, {}) {}
  std::string backendName() const override { return "minimal"; }
};
}  // namespace

TEST_CASE("operations a backend lacks fail naming backend and operation", "[registry]") {
  MinimalGroup group;
  at::Tensor t = at::ones({3});
  CHECK_THROWS_WITH(group.allreduce(t), "backend 'minimal' does not support allreduce");
  CHECK_THROWS_WITH(group.barrier(), "backend 'minimal' does not support barrier");
}
