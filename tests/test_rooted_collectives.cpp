// reduce, gather, scatter and alltoall (issue 34) against their closed
// forms: gloo through shared memory and over TCP, world sizes 1-4, element
// counts from 0 to beyond a frame, three dtypes, uneven splits with zeros.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include "framework/comm/process_group.hpp"
#include "framework/core/errors.hpp"
#include "tests/test_support.hpp"

using namespace ddp;
using Catch::Contains;

TEST_CASE("reduce gather and scatter match their closed forms", "[collectives][rooted][solo]") {
  for (const bool shm : {true, false}) {
    for (const int world : {1, 2, 3, 4}) {
      for (const int64_t n : {int64_t{0}, int64_t{1}, int64_t{1000}, int64_t{70000}}) {
        for (const at::ScalarType type : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kInt, at::kLong}) {
          INFO((shm ? "shm" : "tcp") << ", world " << world << ", " << n << " elements, " << c10::toString(type));
          ProcessGroupOptions options;
          options.sharedMemory = shm;
          const auto errors = ddp::test::runRanks(
              "gloo", world,
              [&](int r, ProcessGroup& g) {
                const auto opts = at::TensorOptions().dtype(type);
                const int root = world - 1;
                // reduce: sum and max on the root, the others untouched.
                at::Tensor t = at::full({n}, r + 1, opts);
                ReduceOptions sum;
                sum.root = root;
                g.reduce(t, sum)->wait();
                ddp::test::expectOnRank(n == 0 || t.eq(r == root ? world * (world + 1) / 2 : r + 1).all().item<bool>(), "reduce sum");
                at::Tensor m = at::full({n}, r + 1, opts);
                ReduceOptions max;
                max.root = 0;
                max.op = ReduceOp::Max;
                g.reduce(m, max)->wait();
                ddp::test::expectOnRank(n == 0 || m.eq(r == 0 ? world : r + 1).all().item<bool>(), "reduce max");
                // gather to root 0: slice k holds rank k's input.
                at::Tensor in = at::full({n}, 10 * r, opts);
                at::Tensor out = r == 0 ? at::full({n * world}, -1, opts) : at::Tensor();
                GatherOptions gather;
                g.gather(in, out, gather)->wait();
                if (r == 0) {
                  for (int k = 0; k < world; ++k) {
                    ddp::test::expectOnRank(n == 0 || out.narrow(0, k * n, n).eq(10 * k).all().item<bool>(), "gather slice");
                  }
                }
                // scatter from the last rank: rank k gets slice k.
                // Values below 256: exact in every dtype.
                const auto pattern = [&](int64_t from, int64_t to) {
                  return at::arange(from, to, at::kLong).remainder(250).to(type);
                };
                at::Tensor whole = pattern(0, n * world);
                at::Tensor mine = at::full({n}, -1, opts);
                ScatterOptions scatter;
                scatter.root = root;
                g.scatter(r == root ? whole : at::Tensor(), mine, scatter)->wait();
                ddp::test::expectOnRank(at::equal(mine, pattern(n * r, n * (r + 1))), "scatter slice");
              },
              options);
          CHECK(ddp::test::joinErrors(errors) == "");
        }
      }
    }
  }
}

namespace {
// Equal splits (in each dtype), then uneven ones with zero rows, over rows
// of `width`. Row values source*16 + destination stay below 256 up to 15
// ranks: exact in every dtype.
void alltoallClosedForms(int r, ProcessGroup& g, int world, int64_t width) {
  for (const at::ScalarType type : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kInt, at::kLong}) {
    // Equal: 2 rows to each rank.
    at::Tensor in = at::empty({2 * world, width}, type);
    for (int j = 0; j < world; ++j) in.narrow(0, 2 * j, 2).fill_(r * 16 + j);
    at::Tensor out = at::full({2 * world, width}, -1, type);
    g.alltoall(in, out)->wait();
    for (int i = 0; i < world; ++i) {
      ddp::test::expectOnRank(out.narrow(0, 2 * i, 2).eq(i * 16 + r).all().item<bool>(),
                              std::string("equal alltoall, ") + c10::toString(type));
    }
  }
  // Uneven: rank i sends (i + j) % 3 rows to rank j (some 0).
  const auto rows = [](int i, int j) { return int64_t((i + j) % 3); };
  std::vector<int64_t> send, recv;
  int64_t sendTotal = 0, recvTotal = 0;
  for (int j = 0; j < world; ++j) {
    send.push_back(rows(r, j));
    recv.push_back(rows(j, r));
    sendTotal += send.back();
    recvTotal += recv.back();
  }
  at::Tensor uin = at::empty({sendTotal, width}, at::kLong);
  for (int j = 0, offset = 0; j < world; offset += static_cast<int>(send[static_cast<size_t>(j)]), ++j) {
    uin.narrow(0, offset, send[static_cast<size_t>(j)]).fill_(r * 100 + j);
  }
  at::Tensor uout = at::full({recvTotal, width}, -1, at::kLong);
  g.alltoall(uin, uout, send, recv)->wait();
  for (int i = 0, offset = 0; i < world; offset += static_cast<int>(recv[static_cast<size_t>(i)]), ++i) {
    ddp::test::expectOnRank(uout.narrow(0, offset, recv[static_cast<size_t>(i)]).eq(i * 100 + r).all().item<bool>(),
           "uneven alltoall");
  }
}
}  // namespace

TEST_CASE("alltoall: equal and uneven splits with zero rows match their closed forms", "[collectives][rooted]") {
  for (const bool shm : {true, false}) {
    for (const int world : {1, 2, 3, 4}) {
      // Rows of 300000 make blocks of several shared-memory rounds (at 3 ranks).
      for (const int64_t width : {int64_t{1}, int64_t{3}, int64_t{5000}, int64_t{300000}}) {
        if (width > 5000 && world != 3) continue;
        INFO((shm ? "shm" : "tcp") << ", world " << world << ", rows of " << width);
        ProcessGroupOptions options;
        options.sharedMemory = shm;
        const auto errors = ddp::test::runRanks(
            "gloo", world, [&](int r, ProcessGroup& g) { alltoallClosedForms(r, g, world, width); }, options);
        CHECK(ddp::test::joinErrors(errors) == "");
      }
    }
  }
}

// Above 8 ranks gloo's frames form a ring, not a mesh: alltoall over TCP
// sends one message per pair instead, and a receiver whose outputSplits
// disagree names the sender and both counts.
TEST_CASE("alltoall gather and scatter over TCP at 9 ranks go point to point", "[collectives][rooted]") {
  const int world = 9;
  ProcessGroupOptions options;
  options.sharedMemory = false;
  for (const int64_t width : {int64_t{0}, int64_t{1}, int64_t{3000}}) {
    INFO("rows of " << width);
    const auto errors = ddp::test::runRanks(
        "gloo", world,
        [&](int r, ProcessGroup& g) {
          if (width > 0) alltoallClosedForms(r, g, world, width);
          // gather to rank 4, then scatter from rank 7.
          at::Tensor in = at::full({width}, 10 * r, at::kLong);
          at::Tensor out = r == 4 ? at::full({width * world}, -1, at::kLong) : at::Tensor();
          GatherOptions go;
          go.root = 4;
          g.gather(in, out, go)->wait();
          if (r == 4) ddp::test::expectOnRank(at::equal(out, at::arange(world).repeat_interleave(width) * 10), "gather");
          at::Tensor whole = r == 7 ? at::arange(width * world, at::kLong) : at::Tensor();
          at::Tensor mine = at::full({width}, -1, at::kLong);
          ScatterOptions so;
          so.root = 7;
          g.scatter(whole, mine, so)->wait();
          ddp::test::expectOnRank(at::equal(mine, at::arange(width * r, width * (r + 1), at::kLong)), "scatter");
        },
        options);
    CHECK(ddp::test::joinErrors(errors) == "");
  }
  const auto errors = ddp::test::runRanks(
      "gloo", world,
      [&](int r, ProcessGroup& g) {
        at::Tensor in = at::ones({world, 2});
        std::vector<int64_t> ones(world, 1), recv(world, 1);
        if (r == 0) recv[1] = 2;
        at::Tensor out = at::empty({r == 0 ? world + 1 : world, 2});
        g.alltoall(in, out, ones, recv)->wait();
      },
      options);
  INFO(ddp::test::joinErrors(errors));
  CHECK_THAT(errors[0], Contains("gloo alltoall #0: the block from rank 1 (4 elements expected)") &&
                            Contains("rank 1 sent 2 x Float, this recv expects 4 x float32"));
  // A pair with no rows is a message too: rank 2 expects none from rank 5,
  // which sends one; rank 6 expects one from rank 7, which sends none.
  const auto zeros = ddp::test::runRanks(
      "gloo", world,
      [&](int r, ProcessGroup& g) {
        std::vector<int64_t> send(world, 1), recv(world, 1);
        if (r == 2) recv[5] = 0;
        if (r == 7) send[6] = 0;
        int64_t sent = 0, received = 0;
        for (int j = 0; j < world; ++j) {
          sent += send[static_cast<size_t>(j)];
          received += recv[static_cast<size_t>(j)];
        }
        at::Tensor in = at::ones({sent, 2}), out = at::empty({received, 2});
        g.alltoall(in, out, send, recv)->wait();
      },
      options);
  INFO(ddp::test::joinErrors(zeros));
  CHECK_THAT(zeros[2], Contains("the block from rank 5 (0 elements expected)") &&
                           Contains("rank 5 sent 2 x Float, this recv expects 0 x float32"));
  CHECK_THAT(zeros[6], Contains("the block from rank 7 (2 elements expected)") &&
                           Contains("rank 7 sent 0 x Float, this recv expects 2 x float32"));
}

// Several simulated hosts with several ranks each (hierarchical_group.hpp):
// the blocks go straight between the ranks, across hosts too.
TEST_CASE("alltoall gather and scatter across simulated hosts match their closed forms",
          "[collectives][rooted][hierarchical]") {
  ddp::test::ScopedEnv shm("DDP_GLOO_SHM", nullptr);
  ddp::test::ScopedEnv hierarchical("DDP_GLOO_HIERARCHICAL", nullptr);
  for (const std::string layout : {"0011", "0101", "01122"}) {
    const int world = static_cast<int>(layout.size());
    INFO("hosts of the ranks: " << layout);
    const auto errors = ddp::test::runRanks(
        "gloo", world,
        [&](int r, ProcessGroup& g) {
          ddp::test::expectOnRank(g.describeEndpoint().find(" on host ") != std::string::npos, "a hierarchical group");
          try {
            SendOptions internal;
            internal.tag = -1;
            g.send(at::ones({1}), (r + 1) % world, internal);
            throw std::runtime_error("a negative tag was taken");
          } catch (const UsageError& e) {
            ddp::test::expectOnRank(std::string(e.what()).find("negative tags are internal") != std::string::npos,
                                    e.what());
          }
          for (const int64_t width : {int64_t{1}, int64_t{5000}}) alltoallClosedForms(r, g, world, width);
          for (const int64_t n : {int64_t{0}, int64_t{3}, int64_t{70000}}) {
            const int root = world - 1;
            at::Tensor in = at::full({n}, 10 * r, at::kFloat);
            at::Tensor out = r == root ? at::full({n * world}, -1, at::kFloat) : at::Tensor();
            GatherOptions go;
            go.root = root;
            g.gather(in, out, go)->wait();
            if (r == root) {
              ddp::test::expectOnRank(at::equal(out, at::arange(world).repeat_interleave(n).to(at::kFloat) * 10),
                                      "gather");
            }
            // scatter into a non-contiguous output (a column)
            at::Tensor whole = r == 1 ? at::arange(n * world, at::kFloat) : at::Tensor();
            at::Tensor grid = at::full({n, 2}, -1, at::kFloat);
            at::Tensor column = grid.select(1, 1);
            ScatterOptions so;
            so.root = 1;
            g.scatter(whole, column, so)->wait();
            ddp::test::expectOnRank(at::equal(grid.select(1, 1), at::arange(n * r, n * (r + 1), at::kFloat)),
                                    "scatter");
          }
        },
        {},
        [&](int r) {
          ProcessGroupOptions o;
          o.hostId = std::string("host-") + layout[static_cast<size_t>(r)];
          return o;
        });
    CHECK(ddp::test::joinErrors(errors) == "");
  }
}

TEST_CASE("alltoall and the rooted collectives refuse what does not fit, on every rank alike",
          "[collectives][rooted][errors]") {
  // Rank 0 expects 2 rows from rank 1, which sends 1. Rows of 2M elements
  // (8 MiB) keep the senders busy when the first rank finds the mistake.
  for (const int64_t width : {int64_t{2}, int64_t{2} << 20}) {
    const auto disagree = [width](int r, ProcessGroup& g) {
      at::Tensor in = at::ones({3, width});
      std::vector<int64_t> recv = {1, r == 0 ? 2 : 1, 1};
      at::Tensor out = at::empty({r == 0 ? 4 : 3, width});
      g.alltoall(in, out, {1, 1, 1}, recv)->wait();
    };
    // Through shared memory and over the frames' mesh every rank sees every
    // rank's splits, and all fail alike before any row moves.
    for (const bool shm : {true, false}) {
      ProcessGroupOptions options;
      options.sharedMemory = shm;
      const auto errors = ddp::test::runRanks("gloo", 3, disagree, options);
      INFO((shm ? "shm: " : "tcp: ") << "rows of " << width << ": " << ddp::test::joinErrors(errors));
      for (int r = 0; r < 3; ++r) {
        CHECK_THAT(errors[static_cast<size_t>(r)],
                   Contains("gloo alltoall #0: rank 1 sends 1 row(s) to rank 0, which expects 2 (its "
                            "outputSplits[1])") &&
                       Contains("HINT: rank 0's outputSplits[1] must equal rank 1's inputSplits[0]"));
      }
    }
  }
  // Ranks that name different roots fail alike, naming both calls.
  for (const bool shm : {true, false}) {
    ProcessGroupOptions options;
    options.sharedMemory = shm;
    const auto roots = ddp::test::runRanks(
        "gloo", 3,
        [&](int r, ProcessGroup& g) {
          at::Tensor in = at::ones({4});
          at::Tensor out = at::empty({12});
          GatherOptions go;
          go.root = r == 2 ? 1 : 0;
          g.gather(in, out, go)->wait();
        },
        options);
    INFO((shm ? "shm: " : "tcp: ") << ddp::test::joinErrors(roots));
    for (int r = 0; r < 3; ++r) CHECK_THAT(roots[static_cast<size_t>(r)], Contains("gather #0") && Contains("root"));
  }
  const auto more = ddp::test::runRanks("gloo", 2, [&](int r, ProcessGroup& g) {
    at::Tensor t = at::ones({4});
    ReduceOptions o;
    o.root = 2;
    try {
      g.reduce(t, o);
      throw std::runtime_error("no error for root 2");
    } catch (const UsageError& e) {
      ddp::test::expectOnRank(std::string(e.what()).find("reduce: root 2 is outside the group's 2 ranks") != std::string::npos,
             e.what());
    }
    at::Tensor small = at::empty({3});
    GatherOptions go;
    if (r == 0) {
      try {
        g.gather(t, small, go);
        throw std::runtime_error("no error for a short gather output");
      } catch (const UsageError& e) {
        ddp::test::expectOnRank(std::string(e.what()).find("gather: root's output has 3 elements, expected 4 x 2 ranks") !=
                   std::string::npos,
               e.what());
      }
    }
    at::Tensor both = at::ones({4, 1});
    try {
      g.alltoall(both, both);
      throw std::runtime_error("no error for alltoall in place");
    } catch (const UsageError& e) {
      ddp::test::expectOnRank(std::string(e.what()).find("input and output share memory") != std::string::npos,
                              e.what());
    }
    at::Tensor halves = at::ones({8, 1});
    at::Tensor low = halves.narrow(0, 0, 4), high = halves.narrow(0, 4, 4);
    g.alltoall(low, high)->wait();  // one storage, apart: fine
    at::Tensor odd = at::ones({3, 1});
    at::Tensor out = at::empty({3, 1});
    try {
      g.alltoall(odd, out);
      throw std::runtime_error("no error for 3 rows over 2 ranks");
    } catch (const UsageError& e) {
      ddp::test::expectOnRank(std::string(e.what()).find("input has 3 rows, which 2 ranks cannot split equally") != std::string::npos,
             e.what());
    }
  });
  CHECK(ddp::test::joinErrors(more) == "");
}

// NCCL: the same closed forms at world size 1 and at every GPU count above
// it (one rank per GPU), CPU tensors staged through the device; send/recv
// around a ring needs two GPUs. Skipped, with the reason, without NCCL or a
// GPU (benchmarks/gpu_check.sh runs it on one).
TEST_CASE("nccl alltoall gather scatter and send/recv match their closed forms", "[collectives][rooted][nccl][solo]") {
  std::string whyNot;
  if (!ddp::test::backendRunnable("nccl", &whyNot)) {
    WARN("SKIPPED: " << whyNot);
    return;
  }
  const int gpus = ddp::test::cudaDevices();
  if (gpus < 2) WARN("send/recv SKIPPED: NCCL needs a GPU per rank, and this machine has " << gpus);
  for (int world = 1; world <= gpus; ++world) {
    INFO("world size " << world);
    const auto errors = ddp::test::runRanks("nccl", world, [&](int r, ProcessGroup& g) {
      for (const int64_t width : {int64_t{1}, int64_t{5000}}) alltoallClosedForms(r, g, world, width);
      const int64_t n = 1000;
      at::Tensor in = at::full({n}, 10 * r, at::kFloat);
      at::Tensor out = r == 0 ? at::full({n * world}, -1, at::kFloat) : at::Tensor();
      g.gather(in, out, {})->wait();
      if (r == 0) {
        ddp::test::expectOnRank(at::equal(out, at::arange(world).repeat_interleave(n).to(at::kFloat) * 10), "gather");
      }
      at::Tensor whole = r == world - 1 ? at::arange(n * world, at::kFloat) : at::Tensor();
      at::Tensor mine = at::full({n}, -1, at::kFloat);
      ScatterOptions so;
      so.root = world - 1;
      g.scatter(whole, mine, so)->wait();
      ddp::test::expectOnRank(at::equal(mine, at::arange(n * r, n * (r + 1), at::kFloat)), "scatter");
      if (world >= 2) {  // around the ring; even ranks send first, odd ones receive first
        at::Tensor ping = at::arange(n, at::kFloat) + r, got = at::full({n}, -1, at::kFloat);
        const int right = (r + 1) % world, left = (r + world - 1) % world;
        if (r % 2 == 0) {
          g.send(ping, right)->wait();
          WorkPtr w = g.recv(got, left);
          w->wait();
          ddp::test::expectOnRank(w->sourceRank() == left, "sourceRank");
        } else {
          g.recv(got, left)->wait();
          g.send(ping, right)->wait();
        }
        ddp::test::expectOnRank(at::equal(got, at::arange(n, at::kFloat) + left), "ring");
      }
    });
    CHECK(ddp::test::joinErrors(errors) == "");
  }
}
