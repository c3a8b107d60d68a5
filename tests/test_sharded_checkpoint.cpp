// Sharded checkpoints (framework/checkpoint, parallel/held_state): saved by
// one strategy at one world size, loaded by another at another, against
// the consolidated checkpoint of the same training as the reference; and
// the files' failures, each named. Ranks are threads over gloo.
#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "framework/checkpoint/sharded_checkpoint.hpp"
#include "framework/comm/sub_groups.hpp"
#include "framework/interop/safetensors.hpp"
#include "framework/parallel/held_state.hpp"
#include "framework/parallel/strategy.hpp"
#include "framework/store/hash_store.hpp"
#include "tests/sharding_support.hpp"
#include "tests/test_support.hpp"

using namespace ddp;
using namespace ddp::test;

// Named, not anonymous: unity batches merge anonymous namespaces of files.
namespace sharded_checkpoint_test {

// A strategy at a world size; hsdp is a mesh of 2 rows.
struct Layout {
  std::string strategy;
  int world;
  std::string label() const { return strategy + "@" + std::to_string(world); }
};

using RankBody = std::function<void(int rank, ProcessGroup& all, ParallelStrategy& strategy, Net& net)>;

// Every rank of `layout` as a thread: a Net initialised from `seed` (the
// same on every rank), optionally loaded from a consolidated archive
// before the strategy is built, then body.
void runLayout(const Layout& layout, const std::string& opt, uint64_t seed, const std::string& consolidated,
               const RankBody& body) {
  auto store = std::make_shared<HashStore>();
  store->setTimeout(std::chrono::milliseconds(30000));
  std::vector<std::string> errors(static_cast<size_t>(layout.world));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < layout.world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        GroupFactory groups(store, builtinBackends(), "gloo", rank, layout.world);
        std::vector<int> everyone(static_cast<size_t>(layout.world));
        for (int r = 0; r < layout.world; ++r) everyone[static_cast<size_t>(r)] = r;
        ProcessGroupPtr all = groups.newGroup(everyone);
        auto net = std::make_shared<Net>();
        initParameters(*net, seed);
        auto optimizer = referenceOptimizer(opt, net->parameters());
        if (!consolidated.empty()) {
          std::istringstream bytes(consolidated);
          torch::serialize::InputArchive archive;
          archive.load_from(bytes);
          loadModelAndOptimizer(archive, *net, *optimizer);
        }
        StrategyContext c;
        c.model = net;
        c.optimizer = std::move(optimizer);
        c.ddp.bucketCapBytes = kBucketBytes;
        if (layout.strategy == "hsdp") {
          RankMesh mesh = groups.mesh(2, layout.world / 2);
          c.group = mesh.shardGroup;
          c.replicateGroup = mesh.replicateGroup;
        } else {
          c.group = all;
        }
        auto strategy = builtinStrategies().create(layout.strategy, std::move(c));
        body(rank, *all, *strategy, *net);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(rank)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  INFO(layout.label() << ": " << joinErrors(errors));
  REQUIRE(joinErrors(errors).empty());
}

// The sharded save of a trainer, in small: each rank its file, the index
// last once every file is there.
void saveSharded(const std::string& dir, int rank, ProcessGroup& all, ParallelStrategy& s, const std::string& id) {
  writeShardFile(dir, rank, id, savedSlices(s.heldState(), s.optimizer()));
  all.barrier({})->wait();
  if (rank == 0) writeShardIndex(dir, all.size(), id, nlohmann::json{{"steps", 3}});
  all.barrier({})->wait();
}

struct Saved {
  std::string consolidated;  // rank 0's archive, serialized
  std::string dir;           // the sharded checkpoint
};

// 3 steps under `layout`, saved both ways.
Saved saveBothWays(const Layout& layout, const std::string& opt, const ZeroData& data, const std::string& dir) {
  Saved saved{"", dir};
  runLayout(layout, opt, 42, "", [&](int rank, ProcessGroup& all, ParallelStrategy& s, Net&) {
    trainSteps(s, data, rank, layout.world, 0, 3);
    torch::serialize::OutputArchive archive;
    s.saveState(rank == 0 ? &archive : nullptr);
    if (rank == 0) {
      std::ostringstream bytes;
      archive.save_to(bytes);
      saved.consolidated = bytes.str();
    }
    saveSharded(dir, rank, all, s, "save:" + dir);
  });
  return saved;
}

// Parameters right after the load, and after 2 more steps, on rank 0.
struct Resumed {
  at::Tensor loaded, trained;
};

Resumed resumeFrom(const Layout& layout, const std::string& opt, const ZeroData& data, const Saved& saved, bool sharded) {
  Resumed out;
  // A sharded load starts from other weights: everything must come from
  // the files.
  runLayout(layout, opt, sharded ? 7 : 42, sharded ? "" : saved.consolidated,
            [&](int rank, ProcessGroup&, ParallelStrategy& s, Net& net) {
              if (sharded) {
                ShardedCheckpoint checkpoint(saved.dir);
                loadHeldState(s.heldState(), s.optimizer(), checkpoint.reader());
                s.afterStateLoaded();
              }
              at::Tensor loaded, trained;
              s.withFullParameters([&] { loaded = flatState(net); });
              trainSteps(s, data, rank, layout.world, 3, 5);
              s.withFullParameters([&] { trained = flatState(net); });
              if (rank == 0) out = {loaded, trained};
            });
  return out;
}

}  // namespace sharded_checkpoint_test

using namespace sharded_checkpoint_test;

TEST_CASE("a sharded checkpoint resumes under any strategy and world size as the consolidated one does",
          "[checkpoint][solo]") {
  const std::string opt = GENERATE("sgd", "adam");
  const ZeroData data = makeZeroData(64 * kBatch);
  const std::vector<Layout> savers = {{"fsdp", 4}, {"zero1", 3}, {"zero2", 2}, {"ddp", 2}, {"hsdp", 4}};
  const std::vector<Layout> loaders = {{"ddp", 1}, {"zero1", 2}, {"fsdp", 3}, {"hsdp", 4}, {"zero2", 3}};
  for (const Layout& saver : savers) {
    TempDir folder;
    const Saved saved = saveBothWays(saver, opt, data, folder.path() + "/epoch_000001.shards");
    REQUIRE(isShardedCheckpoint(saved.dir));
    // Every rank wrote a file of its own, and no more than its share.
    ShardedCheckpoint checkpoint(saved.dir);
    CHECK(checkpoint.files() == saver.world);
    checkpoint.verify();
    for (const Layout& loader : loaders) {
      INFO(opt << ": saved by " << saver.label() << ", loaded by " << loader.label());
      const Resumed reference = resumeFrom(loader, opt, data, saved, false);
      const Resumed got = resumeFrom(loader, opt, data, saved, true);
      CHECK(at::equal(got.loaded, reference.loaded));
      CHECK(relDiff(got.trained, reference.trained) <= 1e-6);
    }
  }
}

TEST_CASE("a sharded save writes each byte once: every rank about 1/world of the state", "[checkpoint]") {
  const ZeroData data = makeZeroData(64 * kBatch);
  for (const Layout layout : {Layout{"ddp", 2}, Layout{"zero2", 3}, Layout{"fsdp", 4}, Layout{"hsdp", 4}}) {
    INFO(layout.label());
    TempDir folder;
    const std::string dir = folder.path() + "/c.shards";
    saveBothWays(layout, "adam", data, dir);
    // 115 trainable elements, 14 of batch norm's buffers and a count; Adam:
    // two moments per trainable element, a step each. Each range once.
    int64_t elements = 0, largest = 0;
    for (int r = 0; r < layout.world; ++r) {
      const auto header = readSafetensorsHeader(ShardedCheckpoint(dir).filePath(r));
      int64_t mine = 0;
      for (const auto& t : header.tensors) mine += t.sizes.at(0);
      elements += mine;
      largest = std::max(largest, mine);
    }
    ShardedCheckpoint checkpoint(dir);
    int64_t expected = 0;
    for (const std::string& name : checkpoint.names()) {
      int64_t n = 1;
      for (int64_t d : checkpoint.shape(name)) n *= d;
      expected += n;
    }
    CHECK(elements == expected);
    CHECK(largest <= expected / layout.world + 24);  // whole values (steps, counts) go to one rank
  }
}

TEST_CASE("sharded checkpoints: a missing, truncated or foreign shard is named, and no index means no checkpoint",
          "[checkpoint]") {
  const ZeroData data = makeZeroData(64 * kBatch);
  TempDir folder;
  const std::string a = folder.path() + "/a.shards", b = folder.path() + "/b.shards";
  saveBothWays({"fsdp", 2}, "sgd", data, a);
  saveBothWays({"fsdp", 2}, "sgd", data, b);
  const std::string shard1 = ShardedCheckpoint(a).filePath(1);

  SECTION("a shard of another save") {
    std::filesystem::copy_file(ShardedCheckpoint(b).filePath(1), shard1, std::filesystem::copy_options::overwrite_existing);
    ShardedCheckpoint checkpoint(a);
    // Same sizes, so only the save id tells.
    CHECK_THROWS_WITH(checkpoint.verify(), Catch::Contains(shard1) && Catch::Contains("shards of two saves"));
  }
  SECTION("a truncated shard") {
    std::filesystem::resize_file(shard1, std::filesystem::file_size(shard1) - 5);
    ShardedCheckpoint checkpoint(a);
    CHECK_THROWS_WITH(checkpoint.verify(), Catch::Contains(shard1) && Catch::Contains("truncated"));
  }
  SECTION("a missing shard") {
    std::filesystem::remove(shard1);
    ShardedCheckpoint checkpoint(a);
    CHECK_THROWS_WITH(checkpoint.verify(), Catch::Contains(shard1) && Catch::Contains("missing"));
  }
  SECTION("no index: not a checkpoint, and writing one finds the missing rank") {
    std::filesystem::remove(a + "/index.json");
    CHECK_FALSE(isShardedCheckpoint(a));
    std::filesystem::remove(shard1);
    CHECK_THROWS_WITH(writeShardIndex(a, 2, "save:" + a, nlohmann::json::object()), Catch::Contains(shard1));
    CHECK_FALSE(isShardedCheckpoint(a));
  }
  SECTION("a malformed index") {
    std::ofstream(a + "/index.json") << "{\"format\": \"something else\"}";
    CHECK_THROWS_WITH(ShardedCheckpoint(a), Catch::Contains(a + "/index.json") && Catch::Contains("ddp-sharded"));
  }
}

TEST_CASE("a sharded save by ranks that hold copies without saying so fails with a hint", "[checkpoint]") {
  // Two ranks that each claim the whole model (the default heldState())
  // write the same ranges twice: the index refuses.
  TempDir folder;
  const std::string dir = folder.path() + "/x.shards";
  auto errors = runRanks("gloo", 2, [&](int rank, ProcessGroup& pg) {
    Net net;
    auto optimizer = referenceOptimizer("sgd", net.parameters());
    writeShardFile(dir, rank, "s", savedSlices(wholeHeldState(net, *optimizer, 1, 0), *optimizer));
    pg.barrier({})->wait();
  });
  REQUIRE(joinErrors(errors).empty());
  CHECK_THROWS_WITH(writeShardIndex(dir, 2, "s", nlohmann::json::object()),
                    Catch::Contains("more than one rank saved") && Catch::Contains("HINT"));
  CHECK_FALSE(isShardedCheckpoint(dir));
}

namespace sharded_checkpoint_test {

// The last record of metrics.jsonl.
nlohmann::json lastMetrics(const std::string& runDir) {
  std::istringstream lines(readFile(runDir + "/metrics.jsonl"));
  std::string line, last;
  while (std::getline(lines, line)) {
    if (!line.empty()) last = line;
  }
  return nlohmann::json::parse(last);
}

}  // namespace sharded_checkpoint_test

TEST_CASE("ddp-run: fsdp on 2 ranks saves in the background and ddp on 1 rank resumes past a bad shard",
          "[checkpoint][process][solo]") {
  TempDir folder;
  const std::string wine = std::string(DDP_SOURCE_DIR) + "/experiments/wine_ddp.json";
  const std::string common = " --set training.epochs=4 --set training.save_every=1 --set training.eval_every=0"
                             " --set distributed.strategy=fsdp --nproc-per-node 2";
  const std::string a = folder.path() + "/async", b = folder.path() + "/consolidated";
  auto o = runDdpRun(wine + common + " --set training.async_checkpoint=true --out " + a);
  REQUIRE(o.exitCode == 0);
  o = runDdpRun(wine + common + " --set training.checkpoint_format=consolidated --out " + b);
  REQUIRE(o.exitCode == 0);
  const std::string log = readFile(a + "/train.log");
  for (int epoch = 1; epoch <= 4; ++epoch) {
    const std::string dir = fmt::format("{}/checkpoints/epoch_{:06}.shards", a, epoch);
    CHECK(isShardedCheckpoint(dir));
    // Epochs 1-3 in the background; the last one before the job ends.
    const std::string line = fmt::format("checkpoint epoch_{:06}.shards: training stood still ", epoch);
    const size_t at = log.find(line);
    REQUIRE(at != std::string::npos);
    CHECK((log.find("written in the background", at) < log.find('\n', at)) == (epoch < 4));
  }
  // Saving changes nothing of the training.
  CHECK(lastMetrics(a)["train_loss"] == lastMetrics(b)["train_loss"]);

  // Resume both under ddp on 1 rank from epoch 3 (the sharded one's epoch
  // 4 has a truncated shard: it is skipped, named in train.log).
  const std::string bad = ShardedCheckpoint(a + "/checkpoints/epoch_000004.shards").filePath(1);
  std::filesystem::resize_file(bad, std::filesystem::file_size(bad) - 7);
  std::filesystem::remove(b + "/checkpoints/epoch_000004.pt");
  const std::string more = " --resume --set training.epochs=6 --set distributed.strategy=ddp --nproc-per-node 1";
  o = runDdpRun(wine + " --out " + a + more);
  REQUIRE(o.exitCode == 0);
  o = runDdpRun(wine + " --out " + b + more);
  REQUIRE(o.exitCode == 0);
  const std::string resumedLog = readFile(a + "/train.log");
  CHECK(resumedLog.find(bad) != std::string::npos);
  CHECK(resumedLog.find("resuming from " + a + "/checkpoints/epoch_000003.shards") != std::string::npos);
  const double sharded = lastMetrics(a)["train_loss"], consolidated = lastMetrics(b)["train_loss"];
  CHECK(std::abs(sharded - consolidated) <= 1e-6 * std::max(1.0, std::abs(consolidated)));

  // No checkpoint left that can be read: one line naming the newest, exit 2.
  // (Epoch 6, written under ddp, is a consolidated file: auto.)
  CHECK(std::filesystem::is_regular_file(a + "/checkpoints/epoch_000006.pt"));
  for (const auto& entry : std::filesystem::directory_iterator(a + "/checkpoints")) {
    if (entry.is_directory()) {
      std::ofstream(entry.path() / "index.json") << "{\"format\": 1}";
    } else {
      std::ofstream(entry.path(), std::ios::trunc) << "garbage";
    }
  }
  o = runDdpRun(wine + " --out " + a + more + " --set training.epochs=8");
  CHECK(o.exitCode == 2);
  CHECK(o.output.find("--resume: no checkpoint in " + a + "/checkpoints can be read; the newest: checkpoint " + a +
                      "/checkpoints/epoch_000006.pt cannot be read") != std::string::npos);
  // A sharded one's error names its index.
  std::filesystem::remove(a + "/checkpoints/epoch_000006.pt");
  o = runDdpRun(wine + " --out " + a + more + " --set training.epochs=8");
  INFO(o.output);
  CHECK(o.exitCode == 2);
  CHECK(o.output.find("the newest: checkpoint " + a + "/checkpoints/epoch_000004.shards cannot be read (") !=
        std::string::npos);
  CHECK(o.output.find(a + "/checkpoints/epoch_000004.shards/index.json is not a sharded checkpoint's index") !=
        std::string::npos);
}

// A checkpoint taken mid-epoch on a signal, resumed at another world size:
// the epoch's samples not read yet are dealt over the new world (equal
// shards under fsdp, which cannot shadow a step; unpadded under ddp),
// instead of the new world's shard from the old batch count, which would
// read some samples twice and others never.
TEST_CASE("ddp-run: a mid-epoch checkpoint resumes at another world size with the epoch's unread samples",
          "[checkpoint][process][solo]") {
  TempDir folder;
  const std::string wine = std::string(DDP_SOURCE_DIR) + "/experiments/wine_ddp.json";
  const std::string run = folder.path() + "/run";
  const int64_t batch = 16;
  const std::string settings = " --set training.epochs=3 --set training.batch_size=16 --set training.save_every=0"
                               " --set training.eval_every=0 --set training.checkpoint_on_signal=true"
                               " --set training.checkpoint_format=sharded";
  auto o = runDdpRun(wine + " --nproc-per-node 2 --out " + run + settings + " --set distributed.strategy=fsdp",
                     "DDP_FAULT_INJECT=0@7:term");
  INFO(o.output);
  REQUIRE(o.exitCode != 0);  // stopped by the signal, after its checkpoint
  const std::string log = readFile(run + "/train.log");
  int64_t trainSamples = 0, stoppedAt = 0, batches = 0, epoch = 0;
  {
    const size_t at = log.find(" train / ");
    REQUIRE(at != std::string::npos);
    trainSamples = std::stoll(log.substr(log.rfind(' ', at - 1) + 1));
    const size_t saved = log.find("signal 15: saved ");
    REQUIRE(saved != std::string::npos);
    REQUIRE(std::sscanf(log.c_str() + log.find("(step ", saved), "(step %ld, %ld batches into epoch %ld)", &stoppedAt,
                        &batches, &epoch) == 3);
  }
  REQUIRE(epoch == 2);
  REQUIRE(batches > 0);
  const int64_t consumed = batches * batch * 2;
  const int64_t left = trainSamples - consumed;
  REQUIRE(left > 0);
  const std::string shards = fmt::format("{}/checkpoints/epoch_{:06}_batch_{:06}.shards", run, epoch, batches);
  REQUIRE(isShardedCheckpoint(shards));
  std::filesystem::copy(run, folder.path() + "/ddp", std::filesystem::copy_options::recursive);

  struct Resume {
    std::string folder, settings;
    int world;
    int64_t remainderSteps;  // of epoch 2 at the new world size
  };
  const auto ceilDiv = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  const std::vector<Resume> resumes = {
      // fsdp: equal shards of the rest, ceil(left / 3) each.
      {run, "--nproc-per-node 3 --set distributed.strategy=fsdp", 3, ceilDiv(ceilDiv(left, 3), batch)},
      // ddp on 1 rank: the rest, once.
      {folder.path() + "/ddp", "--nproc-per-node 1 --set distributed.strategy=ddp", 1, ceilDiv(left, batch)},
  };
  for (const Resume& r : resumes) {
    INFO(r.settings);
    o = runDdpRun(wine + " --resume --out " + r.folder + settings + " " + r.settings);
    INFO(o.output);
    REQUIRE(o.exitCode == 0);
    const std::string resumed = readFile(r.folder + "/train.log");
    CHECK(resumed.find(fmt::format("(saved at world size 2; the {} samples of epoch 2 not read yet are dealt over {} "
                                   "ranks)",
                                   left, r.world)) != std::string::npos);
    // Steps: those before the stop, the rest of epoch 2, then epoch 3 whole.
    const int64_t expected = stoppedAt + r.remainderSteps + ceilDiv(ceilDiv(trainSamples, r.world), batch);
    CHECK(o.output.find(fmt::format("done: {} steps", expected)) != std::string::npos);
  }
}

TEST_CASE("sharded checkpoints: two saves in one folder never write the same file, a stale writer changes nothing",
          "[checkpoint]") {
  TempDir folder;
  const std::string dir = folder.path() + "/epoch_000005.shards";
  // Rank r of 2 holds elements [3r, 3r + 3) of "model/w", all equal to `value`.
  auto save = [&](int rank, const std::string& id, float value) {
    writeShardFile(dir, rank, id, {StateSlice{"model/w", {6}, 3 * rank, at::full({3}, value), ""}});
  };
  auto files = [&] {
    std::set<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(dir)) names.insert(e.path().filename().string());
    return names;
  };
  save(0, "a", 1);
  save(1, "a", 1);
  writeShardIndex(dir, 2, "a", nlohmann::json::object());
  CHECK(ShardedCheckpoint(dir).readWhole("model/w").equal(at::full({6}, 1.f)));

  // The same point saved again: until its index is in, the folder is save a.
  save(0, "b", 2);
  save(1, "b", 2);
  CHECK(files().size() == 5);  // a's two files and index, b's two files
  {
    ShardedCheckpoint stillA(dir);
    CHECK(stillA.saveId() == "a");
    CHECK_NOTHROW(stillA.verify());
  }
  writeShardIndex(dir, 2, "b", nlohmann::json::object());
  CHECK(files() == std::set<std::string>{"index.json", shardFileName(0, "b"), shardFileName(1, "b")});

  // A rank left out of save a wakes and finishes its write: a file of its own.
  save(1, "a", 9);
  ShardedCheckpoint b(dir);
  CHECK(b.saveId() == "b");
  CHECK_NOTHROW(b.verify());
  CHECK(b.readWhole("model/w").equal(at::full({6}, 2.f)));

  // A save that fails removes only its own files; the folder stays for b.
  save(0, "c", 3);
  removeShardSave(dir, "c");
  CHECK_FALSE(std::filesystem::exists(dir + "/" + shardFileName(0, "c")));
  CHECK(ShardedCheckpoint(dir).readWhole("model/w").equal(at::full({6}, 2.f)));

  // The next index clears the stale writer's file too.
  save(0, "d", 4);
  save(1, "d", 4);
  writeShardIndex(dir, 2, "d", nlohmann::json::object());
  CHECK(files() == std::set<std::string>{"index.json", shardFileName(0, "d"), shardFileName(1, "d")});

  // A rank 0 that the group went on without writes no index over d's.
  save(0, "e", 5);
  save(1, "e", 5);
  CHECK_THROWS_WITH(writeShardIndex(dir, 2, "e", nlohmann::json::object(), [] { return false; }),
                    Catch::Contains("index not written: the group went on without this rank"));
  CHECK(ShardedCheckpoint(dir).saveId() == "d");
  CHECK_FALSE(std::filesystem::exists(dir + "/index.json.e.tmp"));
  removeShardSave(dir, "e");

  // A caller that fails after d's index is in place removes nothing of it.
  removeShardSave(dir, "d");
  CHECK(ShardedCheckpoint(dir).readWhole("model/w").equal(at::full({6}, 4.f)));

  // A folder that holds only the failed save's files goes with them.
  const std::string alone = folder.path() + "/epoch_000006.shards";
  writeShardFile(alone, 0, "e", {StateSlice{"model/w", {3}, 0, at::ones({3}), ""}});
  removeShardSave(alone, "e");
  CHECK_FALSE(std::filesystem::exists(alone));
}
