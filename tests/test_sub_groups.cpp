// Sub-groups and the rank mesh (framework/comm/sub_groups.hpp; issue 34):
// ranks as threads over one in-memory store, gloo through shared memory
// and over TCP, collectives checked against their closed forms.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include <thread>

#include "backends/builtin.hpp"
#include "backends/gloo/hierarchical_group.hpp"
#include "backends/gloo/process_group_gloo.hpp"
#include "framework/comm/sub_groups.hpp"
#include "framework/core/errors.hpp"
#include "framework/store/hash_store.hpp"
#include "tests/test_support.hpp"

using namespace ddp;
using Catch::Contains;

namespace {

// body(factory, worldGroup) on `world` threads; each rank's exception text, "" where none.
std::vector<std::string> runWorld(int world, bool sharedMemory,
                                  const std::function<void(GroupFactory&, ProcessGroup&)>& body,
                                  std::chrono::milliseconds timeout = std::chrono::milliseconds(20000),
                                  const std::function<std::string(int)>& hostOf = nullptr) {
  auto store = std::make_shared<HashStore>();
  store->setTimeout(timeout);
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        ProcessGroupOptions options;
        options.sharedMemory = sharedMemory;
        options.timeout = timeout;
        if (hostOf) options.hostId = hostOf(r);
        auto worldGroup = builtinBackends().create("gloo", store, r, world, options);
        GroupFactory factory(store, builtinBackends(), "gloo", r, world, options);
        body(factory, *worldGroup);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

// An allreduce (sum) of `numel` elements, each rank contributing `value`;
// throws unless every element is `expect`.
void allreduceExpect(ProcessGroup& group, int64_t numel, double value, double expect, const char* what) {
  at::Tensor t = at::full({numel}, value, at::kDouble);
  group.allreduce(t)->wait();
  if (numel > 0 && !t.eq(expect).all().item<bool>()) {
    throw std::runtime_error(fmt::format("{}: expected {}, got {} (group rank {} of {})", what, expect,
                                         t[0].item<double>(), group.rank(), group.size()));
  }
}

}  // namespace

TEST_CASE("sub-groups: disjoint groups and a 2x2 mesh reduce among their members only", "[collectives][subgroups]") {
  for (const bool shm : {true, false}) {
    for (const int64_t numel : {int64_t{0}, int64_t{1}, int64_t{1000}, int64_t{100000}}) {
      INFO((shm ? "shared memory" : "tcp") << ", " << numel << " elements");
      const auto errors = runWorld(4, shm, [&](GroupFactory& f, ProcessGroup& world) {
        const int r = f.rank();
        ProcessGroupPtr even = f.newGroup({0, 2});
        ProcessGroupPtr odd = f.newGroup({3, 1});  // any order: group rank = place among the sorted ranks
        if ((r % 2 == 0) != (even != nullptr) || (r % 2 == 1) != (odd != nullptr)) {
          throw std::runtime_error("membership wrong");
        }
        ProcessGroup& mine = even ? *even : *odd;
        if (mine.size() != 2 || mine.rank() != r / 2) throw std::runtime_error("group rank wrong");
        // {0,2}: 1 + 3; {1,3}: 2 + 4.
        allreduceExpect(mine, numel, r + 1, r % 2 == 0 ? 4 : 6, "pair");
        const RankMesh mesh = f.mesh(2, 2);
        if (mesh.row != r / 2 || mesh.column != r % 2) throw std::runtime_error("mesh place wrong");
        // Rows {0,1} {2,3}; columns {0,2} {1,3}.
        allreduceExpect(*mesh.shardGroup, numel, r, r < 2 ? 1 : 5, "row");
        allreduceExpect(*mesh.replicateGroup, numel, r, r % 2 == 0 ? 2 : 4, "column");
        at::Tensor b = at::full({numel}, double(r), at::kDouble);
        mesh.shardGroup->broadcast(b, {/*root=*/1})->wait();
        if (numel > 0 && b[0].item<double>() != (r < 2 ? 1 : 3)) throw std::runtime_error("row broadcast wrong");
        allreduceExpect(world, numel, 1, 4, "world after");
      });
      CHECK(ddp::test::joinErrors(errors) == "");
    }
  }
}

TEST_CASE("sub-groups: overlapping groups with collectives in flight at once do not mix",
          "[collectives][subgroups]") {
  for (const bool shm : {true, false}) {
    INFO((shm ? "shared memory" : "tcp"));
    const auto errors = runWorld(4, shm, [&](GroupFactory& f, ProcessGroup&) {
      const int r = f.rank();
      ProcessGroupPtr low = f.newGroup({0, 1, 2});
      ProcessGroupPtr high = f.newGroup({1, 2, 3});
      for (int round = 0; round < 20; ++round) {
        // Each member starts its groups' allreduces, then waits for them all.
        std::vector<at::Tensor> lowT, highT;
        std::vector<WorkPtr> works;
        for (int k = 0; k < 3; ++k) {
          if (low) {
            lowT.push_back(at::full({64 * 1024 + k}, double(r + 1 + round), at::kDouble));
            works.push_back(low->allreduce(lowT.back()));
          }
          if (high) {
            highT.push_back(at::full({100 + k}, double(10 * (r + 1)), at::kDouble));
            works.push_back(high->allreduce(highT.back()));
          }
        }
        for (auto& w : works) w->wait();
        for (auto& t : lowT) {
          if (!t.eq(6 + 3 * round).all().item<bool>()) throw std::runtime_error("low group mixed");
        }
        for (auto& t : highT) {
          if (!t.eq(90).all().item<bool>()) throw std::runtime_error("high group mixed");
        }
      }
    });
    CHECK(ddp::test::joinErrors(errors) == "");
  }
}

TEST_CASE("sub-groups: wrong ranks and disagreeing members fail with a clear error", "[collectives][subgroups][errors][solo]") {
  auto store = std::make_shared<HashStore>();
  GroupFactory f(store, builtinBackends(), "gloo", 0, 4);
  CHECK_THROWS_WITH(f.newGroup({0, 4}), Contains("newGroup #0: ranks [0,4] go beyond the world of 4 (0..3)"));
  CHECK_THROWS_WITH(f.newGroup({1, 1}), Contains("rank 1 is given twice"));
  CHECK_THROWS_WITH(f.newGroup({}), Contains("no ranks"));
  CHECK_THROWS_WITH(f.mesh(3, 2), Contains("rank mesh 3 x 2: needs replicate x shard = the world size 4"));
  // Ranks 0 and 1 call newGroup with different lists.
  const auto errors = runWorld(2, true, [&](GroupFactory& g, ProcessGroup&) {
    g.newGroup(g.rank() == 0 ? std::vector<int>{0, 1} : std::vector<int>{1, 0, 0});
  }, std::chrono::milliseconds(2000));
  CHECK_THAT(errors[1], Contains("rank 0 is given twice"));
  const auto disagree = runWorld(3, true, [&](GroupFactory& g, ProcessGroup&) {
    g.newGroup(g.rank() == 2 ? std::vector<int>{0, 2} : std::vector<int>{0, 1, 2});
  }, std::chrono::milliseconds(5000));
  const std::string all = ddp::test::joinErrors(disagree);
  INFO(all);
  CHECK_THAT(all, Contains("asked for ranks [0,1,2], rank 2 for [0,2]") ||
                      Contains("asked for ranks [0,2], rank 1 for [0,1,2]") || Contains("HINT: every rank must call"));
  CHECK_THAT(disagree[2], Contains("HINT: every rank must call newGroup in the same order with the same ranks"));
}

TEST_CASE("sub-groups: a 4x1 and a 1x4 mesh, and groups of one rank", "[collectives][subgroups]") {
  const auto errors = runWorld(4, true, [&](GroupFactory& f, ProcessGroup&) {
    const int r = f.rank();
    const RankMesh tall = f.mesh(4, 1);
    if (tall.shardGroup->size() != 1 || tall.replicateGroup->size() != 4) throw std::runtime_error("4x1 sizes");
    allreduceExpect(*tall.shardGroup, 10, r, r, "one-rank row");
    allreduceExpect(*tall.replicateGroup, 10, r, 6, "4-rank column");
    const RankMesh wide = f.mesh(1, 4);
    if (wide.shardGroup->size() != 4 || wide.replicateGroup->size() != 1) throw std::runtime_error("1x4 sizes");
    allreduceExpect(*wide.shardGroup, 10, 1, 4, "4-rank row");
  });
  CHECK(ddp::test::joinErrors(errors) == "");
}

TEST_CASE("hsdp through ddp-run: trains wine and digits_cnn as ddp does, and resumes under ddp and fsdp",
          "[subgroups][launcher][solo]") {
  const std::string src = DDP_SOURCE_DIR;
  for (const std::string experiment : {"wine_baseline", "digits_cnn"}) {
    INFO(experiment);
    const std::string common = " --nproc-per-node 4 " + src + "/experiments/" + experiment +
                               ".json --set training.epochs=6 --set training.save_every=3 --set training.eval_every=3";
    const std::string hsdpRun = ddp::test::tempDir() + "/hsdp", ddpRun = ddp::test::tempDir() + "/ddp";
    auto hsdp = ddp::test::runDdpRun(common + " --set distributed.strategy=hsdp --set distributed.shard_size=2 --out " +
                                     hsdpRun);
    INFO(hsdp.output);
    REQUIRE(hsdp.exitCode == 0);
    CHECK_THAT(ddp::test::readFile(hsdpRun + "/train.log"),
               Contains("hsdp: 2 row(s) of 2 rank(s) each shard the model"));
    auto plain = ddp::test::runDdpRun(common + " --out " + ddpRun);
    REQUIRE(plain.exitCode == 0);
    const double hsdpAccuracy = ddp::test::jsonLines(hsdpRun + "/metrics.jsonl").back()["test_accuracy"].get<double>();
    const double ddpAccuracy = ddp::test::jsonLines(ddpRun + "/metrics.jsonl").back()["test_accuracy"].get<double>();
    INFO("hsdp " << hsdpAccuracy << ", ddp " << ddpAccuracy);
    CHECK(hsdpAccuracy >= ddpAccuracy - 0.05);
    CHECK(hsdpAccuracy > (experiment == "wine_baseline" ? 0.7 : 0.9));  // wine: 6 epochs of lr 1e-3
    // The checkpoint is consolidated: ddp on 1 rank and fsdp on 2 continue it.
    auto asDdp = ddp::test::runDdpRun("--nproc-per-node 1 --resume --out " + hsdpRun +
                                      " --set training.epochs=7 --set distributed.strategy=ddp");
    INFO(asDdp.output);
    CHECK(asDdp.exitCode == 0);
    auto asFsdp = ddp::test::runDdpRun("--nproc-per-node 2 --resume --out " + hsdpRun +
                                       " --set training.epochs=8 --set distributed.strategy=fsdp");
    INFO(asFsdp.output);
    CHECK(asFsdp.exitCode == 0);
    CHECK(ddp::test::metricsEpochs(hsdpRun) == std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8});
  }
  auto bad = ddp::test::runDdpRun("--nproc-per-node 4 " + src +
                                  "/experiments/wine_baseline.json --set distributed.strategy=hsdp "
                                  "--set distributed.shard_size=3 --set training.epochs=1 --out " +
                                  ddp::test::tempDir() + "/bad");
  INFO(bad.output);
  CHECK(bad.exitCode == 2);
  CHECK_THAT(bad.output, Contains("distributed.shard_size: 3 does not divide the world size 4. HINT:"));
}

TEST_CASE("sub-groups keep gloo's paths: shared memory within a host, hierarchical across hosts with several ranks",
          "[collectives][subgroups][hierarchical]") {
  // Ranks 0, 1 on host a; 2, 3 on host b.
  const auto errors = runWorld(
      4, true,
      [&](GroupFactory& f, ProcessGroup&) {
        const int r = f.rank();
        ProcessGroupPtr hostA = f.newGroup({0, 1});
        ProcessGroupPtr hostB = f.newGroup({2, 3});
        ProcessGroupPtr sameHost = r < 2 ? hostA : hostB;
        if ((r < 2 ? hostB : hostA) != nullptr) throw std::runtime_error("a non-member got a group");
        ProcessGroupPtr crossHosts = f.newGroup({0, 2});
        ProcessGroupPtr all = f.newGroup({0, 1, 2, 3});
        auto* local = dynamic_cast<ProcessGroupGloo*>(sameHost.get());
        if (!local || !local->usesSharedMemory()) throw std::runtime_error("the same-host pair does not use shared memory");
        if (!dynamic_cast<gloo_backend::HierarchicalGroup*>(all.get())) throw std::runtime_error("the 2x2 group is not hierarchical");
        // One rank per host: a flat group (in this one process its ranks still
        // find each other's shared memory; on real hosts they meet over TCP).
        if (crossHosts) {
          if (!dynamic_cast<ProcessGroupGloo*>(crossHosts.get())) throw std::runtime_error("the cross-host pair is not flat");
          allreduceExpect(*crossHosts, 70000, r, 2, "cross-host pair");
        }
        allreduceExpect(*sameHost, 70000, r, r < 2 ? 1 : 5, "same-host pair");
        allreduceExpect(*all, 70000, r, 6, "all, hierarchical");
      },
      std::chrono::milliseconds(20000), [](int r) { return std::string(r < 2 ? "host-a" : "host-b"); });
  CHECK(ddp::test::joinErrors(errors) == "");
}
