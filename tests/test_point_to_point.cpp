// send and recv (issue 34): gloo through both paths and hierarchical
// groups, element counts from 0 to 4 MB, tags out of order, any source,
// mismatches, timeouts and a peer that goes away.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include <set>

#include "framework/comm/process_group.hpp"
#include "framework/core/errors.hpp"
#include "tests/test_support.hpp"

using namespace ddp;
using Catch::Contains;

TEST_CASE("send/recv around a ring match their closed forms", "[p2p][solo]") {
  for (const bool shm : {true, false}) {
    for (const int world : {2, 3, 4}) {
      for (const int64_t n : {int64_t{0}, int64_t{1}, int64_t{1000}, int64_t{1} << 20}) {
        INFO((shm ? "shm" : "tcp") << ", world " << world << ", " << n << " elements");
        ProcessGroupOptions options;
        options.sharedMemory = shm;
        const auto errors = ddp::test::runRanks(
            "gloo", world,
            [&](int r, ProcessGroup& g) {
              const int right = (r + 1) % world, left = (r + world - 1) % world;
              for (const at::ScalarType type :
                   {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kInt, at::kLong}) {
                // Values below 256: exact in every dtype.
                at::Tensor out = (at::arange(n, at::kLong).remainder(200) + r).to(type);
                at::Tensor in = at::full({n}, -1, at::TensorOptions().dtype(type));
                SendOptions s;
                s.tag = 7;
                RecvOptions rcv;
                rcv.tag = 7;
                WorkPtr sent = g.send(out, right, s);
                WorkPtr got = g.recv(in, left, rcv);
                sent->wait();
                out.fill_(-5);  // once the send has completed, its tensor is the caller's again
                got->wait();
                ddp::test::expectOnRank(at::equal(in, (at::arange(n, at::kLong).remainder(200) + left).to(type)),
                                        "ring values");
                ddp::test::expectOnRank(got->sourceRank() == left, "sourceRank");
              }
            },
            options);
        CHECK(ddp::test::joinErrors(errors) == "");
      }
    }
  }
}

TEST_CASE("send/recv: tags out of order, any source, a hierarchical group", "[p2p]") {
  const auto errors = ddp::test::runRanks(
      "gloo", 4,
      [&](int r, ProcessGroup& g) {
        // Rank 1 sends tags 1, 2, 3 to rank 0, which asks for 3, 1, 2.
        if (r == 1) {
          for (int tag : {1, 2, 3}) {
            SendOptions s;
            s.tag = tag;
            g.send(at::full({100}, 10.0 * tag), 0, s)->wait();
          }
        }
        if (r == 0) {
          for (int tag : {3, 1, 2}) {
            at::Tensor t = at::empty({100});
            RecvOptions o;
            o.tag = tag;
            g.recv(t, 1, o)->wait();
            ddp::test::expectOnRank(t.eq(10.0 * tag).all().item<bool>(), fmt::format("tag {}", tag));
          }
        }
        // Everyone but 0 sends to 0 with tag 9; 0 takes them from any source.
        if (r != 0) {
          SendOptions s;
          s.tag = 9;
          g.send(at::full({3}, 100.0 * r), 0, s)->wait();
        } else {
          std::set<int> sources;
          for (int k = 0; k < 3; ++k) {
            at::Tensor t = at::empty({3});
            RecvOptions o;
            o.tag = 9;
            WorkPtr w = g.recv(t, kAnySourceRank, o);
            w->wait();
            ddp::test::expectOnRank(t.eq(100.0 * w->sourceRank()).all().item<bool>(), "any-source value");
            sources.insert(w->sourceRank());
          }
          ddp::test::expectOnRank(sources == std::set<int>{1, 2, 3}, "any-source senders");
        }
        g.barrier()->wait();
      },
      {}, [](int r) {
        ProcessGroupOptions o;
        o.hostId = r < 2 ? "host-a" : "host-b";  // 2 hosts x 2 ranks: a hierarchical group
        return o;
      });
  CHECK(ddp::test::joinErrors(errors) == "");
}

TEST_CASE("send/recv failures: a mismatch, a timeout, a peer gone, bad ranks", "[p2p][errors]") {
  const auto contains = [](const std::string& text, const std::string& part) {
    ddp::test::expectOnRank(text.find(part) != std::string::npos, "expected \"" + part + "\" in: " + text);
  };
  const auto failure = [](const std::function<void()>& call) -> std::string {
    try {
      call();
    } catch (const CollectiveError& e) {
      return e.what();
    }
    throw std::runtime_error("no CollectiveError");
  };
  // A failed send or recv breaks the group, as a failed collective does:
  // this rank's later calls fail at once with the first error, and the
  // peers' next collective fails too, rather than at its timeout.
  for (const bool shm : {true, false}) {
    INFO((shm ? "shm" : "tcp"));
    ProcessGroupOptions options;
    options.sharedMemory = shm;
    options.timeout = std::chrono::milliseconds(20000);
    const auto mismatch = ddp::test::runRanks(
        "gloo", 2,
        [&](int r, ProcessGroup& g) {
          if (r == 0) {
            g.send(at::ones({5}), 1)->wait();  // 5 float32 to a recv of 4
          } else {
            at::Tensor four = at::empty({4});
            contains(failure([&] { g.recv(four, 0)->wait(); }),
                     "rank 0 sent 5 x Float, this recv expects 4 x float32");
            contains(failure([&] { g.recv(four, 0)->wait(); }), "not run: the group failed earlier");
          }
          const auto start = std::chrono::steady_clock::now();
          failure([&] { g.barrier()->wait(); });
          ddp::test::expectOnRank(std::chrono::steady_clock::now() - start < std::chrono::seconds(10),
                                  "the barrier fails long before its timeout");
        },
        options);
    CHECK(ddp::test::joinErrors(mismatch) == "");
    const auto timeout = ddp::test::runRanks(
        "gloo", 2,
        [&](int r, ProcessGroup& g) {
          if (r == 1) {
            at::Tensor two = at::empty({2});
            RecvOptions quick;
            quick.tag = 4;
            quick.timeout = std::chrono::milliseconds(300);
            contains(failure([&] { g.recv(two, 0, quick)->wait(); }),
                     "gloo recv from rank 0 (tag 4, 2 x float32) timed out after 300 ms");
          }
          // After a timeout, as after a collective's: rank 1 fails at once;
          // rank 0 at once through shared memory, by its own timeout over TCP
          // (the connections are not reset, so no one blames rank 1).
          BarrierOptions soon;
          soon.timeout = std::chrono::milliseconds(1500);
          contains(failure([&] { g.barrier(soon)->wait(); }), r == 1 ? "not run: the group failed earlier" : "barrier");
        },
        options);
    CHECK(ddp::test::joinErrors(timeout) == "");
  }
  const auto errors = ddp::test::runRanks("gloo", 2, [&](int r, ProcessGroup& g) {
    try {
      g.send(at::ones({1}), r);
      throw std::runtime_error("a send to itself was taken");
    } catch (const UsageError& e) {
      ddp::test::expectOnRank(std::string(e.what()).find("is not another rank") != std::string::npos, e.what());
    }
    g.barrier()->wait();  // a refused call breaks nothing
  });
  CHECK(ddp::test::joinErrors(errors) == "");

  // Rank 1 sends once and destroys its group while rank 0 waits for a
  // second message: the recv fails naming it, at once rather than at its
  // timeout (a crashed process's connections close the same way).
  auto store = std::make_shared<HashStore>();
  std::string error;
  std::thread peer([&] {
    auto g = builtinBackends().create("gloo", store, 1, 2);
    g->send(at::ones({3}), 0)->wait();
    g->barrier()->wait();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // rank 0's recv is posted by now
  });  // the group's destructor closes its connections first
  auto g = builtinBackends().create("gloo", store, 0, 2);
  at::Tensor t = at::empty({3});
  g->recv(t, 1)->wait();
  g->barrier()->wait();
  const auto start = std::chrono::steady_clock::now();
  try {
    RecvOptions o;
    o.timeout = std::chrono::milliseconds(20000);
    g->recv(t, 1, o)->wait();
  } catch (const CollectiveError& e) {
    error = e.what();
  }
  const auto took = std::chrono::steady_clock::now() - start;
  g.reset();  // lets the peer's group finish closing
  peer.join();
  INFO(error);
  CHECK_THAT(error, Contains("gloo recv from rank 1 (tag 0, 3 x float32): rank 1 has closed its connection") ||
                        Contains("rank 1 closed its connection"));
  CHECK(took < std::chrono::seconds(5));
}
