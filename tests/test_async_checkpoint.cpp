// AsyncShardWriter (framework/checkpoint/async_shard_writer.hpp): ranks as
// threads, each with its own writer, meeting only through the folder. A
// completed save reads back exactly what was handed over, even when the
// live tensors change right after start(); a rank's failed write, a rank
// that never writes, and a cancelled save leave no index, and the failure
// reaches check()/wait() on the ranks it concerns.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <filesystem>
#include <thread>

#include "framework/checkpoint/async_shard_writer.hpp"
#include "framework/checkpoint/sharded_checkpoint.hpp"
#include "tests/test_support.hpp"

using namespace ddp;
using namespace ddp::test;

namespace async_checkpoint_test {

// Rank r's part of one 1-D tensor "w" of `world * 5` elements: 5 of them.
std::vector<StateSlice> partOf(int rank, int world, const at::Tensor& live) {
  (void)world;
  return {StateSlice{"model/w", {live.numel() * world}, rank * live.numel(), live, ""}};
}

}  // namespace async_checkpoint_test

using namespace async_checkpoint_test;

TEST_CASE("async sharded saves: the state handed over is what is read back, and the index comes last",
          "[checkpoint][async]") {
  TempDir folder;
  const std::string dir = folder.path() + "/epoch_000001.shards";
  const int world = 3;
  std::vector<AsyncShardWriter> writers(world);
  std::vector<at::Tensor> live;
  for (int r = 0; r < world; ++r) live.push_back(at::arange(5, at::kFloat) + 10 * r);
  // Rank 1 starts last: rank 0's thread must wait for its file.
  for (int r : {0, 2, 1}) {
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::vector<StateSlice> slices = partOf(r, world, live[static_cast<size_t>(r)].clone());
    writers[static_cast<size_t>(r)].start(dir, r, world, "save-1", std::move(slices),
                                          nlohmann::json{{"epoch", 1}}, std::chrono::milliseconds(10000));
    live[static_cast<size_t>(r)].add_(1000);  // training goes on: the copy is what is saved
  }
  for (auto& w : writers) REQUIRE_NOTHROW(w.wait());
  REQUIRE(isShardedCheckpoint(dir));
  ShardedCheckpoint checkpoint(dir);
  checkpoint.verify();
  CHECK(checkpoint.meta().at("epoch") == 1);
  const at::Tensor whole = checkpoint.readWhole("model/w");
  CHECK(whole.equal(at::cat({at::arange(5, at::kFloat), at::arange(5, at::kFloat) + 10,
                             at::arange(5, at::kFloat) + 20})));
  // The next save waits for the previous one; a second save of the same
  // writers works as the first.
  const std::string dir2 = folder.path() + "/epoch_000002.shards";
  for (int r = 0; r < world; ++r) {
    writers[static_cast<size_t>(r)].start(dir2, r, world, "save-2", partOf(r, world, live[static_cast<size_t>(r)].clone()),
                                          nlohmann::json{{"epoch", 2}}, std::chrono::milliseconds(10000));
  }
  for (auto& w : writers) REQUIRE_NOTHROW(w.wait());
  CHECK(ShardedCheckpoint(dir2).readWhole("model/w").equal(at::cat(live)));
}

TEST_CASE("async sharded saves: a failed write, a missing rank and a cancel leave no checkpoint",
          "[checkpoint][async][solo]") {
  TempDir folder;
  const std::string dir = folder.path() + "/epoch_000003.shards";
  const int world = 3;
  std::vector<AsyncShardWriter> writers(world);
  auto slices = [&](int r) { return partOf(r, world, at::ones({4}) * r); };

  SECTION("rank 2 cannot write: it fails at its next check, rank 0 names it, no index") {
    // A folder where its temporary file goes: the write fails, no file appears.
    std::filesystem::create_directories(dir + "/" + shardFileName(2, "s") + ".tmp");
    for (int r = 0; r < world; ++r) {
      writers[static_cast<size_t>(r)].start(dir, r, world, "s", slices(r), nlohmann::json::object(),
                                            std::chrono::milliseconds(10000));
    }
    CHECK_THROWS_WITH(writers[2].wait(), Catch::Contains("in the background") && Catch::Contains(shardFileName(2, "s")));
    CHECK_THROWS_WITH(writers[0].wait(), Catch::Contains("rank 2 could not write its shard"));
    // Rank 1's write may or may not finish before rank 0 removes the folder.
    try {
      writers[1].wait();
    } catch (const std::exception&) {
    }
    CHECK_FALSE(isShardedCheckpoint(dir));
    CHECK_FALSE(std::filesystem::exists(dir + "/" + shardFileName(0, "s")));  // rank 0 removed the files
  }
  SECTION("rank 1 never writes: rank 0 gives up after the timeout naming it") {
    writers[0].start(dir, 0, world, "s", slices(0), nlohmann::json::object(), std::chrono::milliseconds(300));
    writers[2].start(dir, 2, world, "s", slices(2), nlohmann::json::object(), std::chrono::milliseconds(300));
    // check() reports nothing while the save is running, then the failure.
    while (writers[0].busy()) {
      REQUIRE_NOTHROW(writers[0].check());
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    CHECK_THROWS_WITH(writers[0].check(), Catch::Contains("rank(s) 1 did not reach"));
    CHECK_NOTHROW(writers[0].check());  // reported once
    CHECK_NOTHROW(writers[2].wait());
    CHECK_FALSE(isShardedCheckpoint(dir));
  }
  SECTION("a cancelled save (a rank died) is dropped without an error") {
    writers[0].start(dir, 0, world, "s", slices(0), nlohmann::json::object(), std::chrono::milliseconds(60000));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CHECK(writers[0].busy());
    const auto started = std::chrono::steady_clock::now();
    writers[0].cancel();
    CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(5));
    CHECK_NOTHROW(writers[0].wait());
    CHECK_FALSE(std::filesystem::exists(dir));
  }
}
