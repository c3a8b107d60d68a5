// The Trainer's checkpoint writing (trainer.hpp): consolidated files atomically, with a full disk named
// as such; sharded checkpoints each rank its file, the index last.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/serialize.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <random>
#include <thread>

#include "framework/checkpoint/sharded_checkpoint.hpp"
#include "framework/core/errors.hpp"
#include "framework/core/log.hpp"
#include "framework/core/system.hpp"
#include "framework/experiment/run_folder.hpp"
#include "framework/experiment/trainer_impl.hpp"

namespace ddp {
namespace {

// What a save's collective allows the slowest disk (a rank that waits
// while others write).
constexpr std::chrono::milliseconds kSlowDisk{600000};

// Runs a save's collective (`start` issues it) and waits for it, which may
// take up to kSlowDisk. In an elastic job a watcher beside it gives up
// sooner: once another member's heartbeat stands still for `timeout`, it
// aborts the group (ProcessGroup::abort: the collective fails here and at
// the peers), and a collective that failed then throws CollectiveError
// naming the member; the members recover and save again over the new
// group. One that completed all the same (the member had done its part)
// returns: the aborted group fails the next collective on every member
// alike. A slow disk leaves a heartbeat beating; a cut link or a frozen
// process does not. The watcher looks twice a second (a read of each
// member's heartbeat), and alone uses the rendezvous meanwhile: this
// thread is inside the collective. gloo may run a small collective in its
// caller, so the watcher runs from before the call.
void guardedSave(ProcessGroup& group, ElasticRendezvous* rendezvous, const ElasticMembership& membership,
                 std::chrono::milliseconds timeout, const std::string& what, const std::function<WorkPtr()>& start) {
  if (rendezvous == nullptr) {
    start()->wait();
    return;
  }
  std::mutex mutex;
  std::condition_variable wake;
  bool done = false;
  std::string lostLine;
  std::thread watcher([&] {
    std::unique_lock<std::mutex> lock(mutex);
    while (!wake.wait_for(lock, std::chrono::milliseconds(500), [&] { return done; })) {
      lock.unlock();
      std::optional<int> lost;
      try {
        lost = rendezvous->lostMember(membership, timeout);
      } catch (const std::exception&) {
        // The store unreachable for a moment: the collective decides.
      }
      std::string line;
      if (lost) {
        line = fmt::format(
            "checkpoint: rank id {} ({}) stopped beating for {} s (distributed.timeout_s) while {}; the save fails "
            "and the members go on without it",
            *lost, rendezvous->whereOf(*lost), timeout.count() / 1000.0, what);
      }
      lock.lock();
      if (!line.empty() && !done) {
        lostLine = line;
        group.abort(line);
        return;
      }
    }
  });
  std::exception_ptr error;
  try {
    start()->wait();
  } catch (...) {
    error = std::current_exception();
  }
  {
    std::lock_guard<std::mutex> lock(mutex);
    done = true;
  }
  wake.notify_all();
  watcher.join();
  if (!lostLine.empty()) logWarn("{}", lostLine);  // on every member that sees it: train.log keeps only its start
  if (error && !lostLine.empty()) fail<CollectiveError>("{}", lostLine);
  if (error) std::rethrow_exception(error);
}

// Asked by an elastic writer before it renames a checkpoint into place: true
// while the group has not gone on without it. A store that fails for a
// moment is asked again; one that fails for about 5 s throws, saying so (no
// checkpoint rather than a stale one).
std::function<bool()> stillInGroup(ElasticRendezvous& rendezvous, const ElasticMembership& membership) {
  return [rendezvous = &rendezvous, membership] {
    for (int attempt = 1;; ++attempt) {
      try {
        return !rendezvous->superseded(membership);
      } catch (const std::exception& e) {
        if (attempt >= 5) {
          fail<std::runtime_error>("the store could not say whether this rank is still in the group ({})",
                                   errorLine(e));
        }
        std::this_thread::sleep_for(std::chrono::seconds(1));
      }
    }
  };
}

}  // namespace

void Trainer::saveCheckpoint(int64_t epoch) { writeCheckpoint(epoch, 0, {}); }

void Trainer::saveCheckpointAs(const std::string& name, int64_t epoch) {
  DDP_CHECK(!name.empty() && name.find("..") == std::string::npos && name.front() != '/',
            "Trainer::saveCheckpointAs: a name inside checkpoints/");
  writeCheckpoint(epoch, 0, {}, name);
}

// Writes the archive to `path` with write(2), so that a full disk is named
// as such (LibTorch's own file writer reports "unexpected pos"), flushed
// to disk; on failure the file is removed and the error names it.
void Trainer::writeCheckpoint(int64_t epoch, int64_t batch, const std::vector<double>& partial,
                              const std::string& name) {
  Impl& s = *impl_;
  const auto& tc = config_.training;
  const auto started = std::chrono::steady_clock::now();
  // One save at a time: a save in the background completes (or fails the
  // job) before the next begins.
  if (s.asyncWriter) s.asyncWriter->wait();
  if (tc.checkpointFormat == "sharded") {
    // Periodic checkpoints go to the background; the last one and one on a
    // signal are written before training goes on (or the job exits).
    const bool background = tc.asyncCheckpoint && name.empty() && batch == 0 && s.signal == 0 &&
                            epoch < tc.epochs && !s.stop;
    writeShardedCheckpoint(epoch, batch, partial, name, background);
    if (s.log) {
      const double stall = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      s.log->line(fmt::format("checkpoint {}: training stood still {:.3f} s{}",
                              name.empty() ? checkpointFileName(epoch, batch, true) : name, stall,
                              background ? " (state copied; written in the background)" : ""));
    }
    return;
  }
  std::optional<torch::serialize::OutputArchive> archive;
  if (isWriter() || s.writesAlone) archive.emplace();
  if (s.strategy) {
    s.strategy->saveState(archive ? &*archive : nullptr);
  } else if (archive) {  // elastic, below the minimum: the whole state is on this rank
    saveModelAndOptimizer(*archive, *s.model, *s.releasedOptimizer);
  }
  std::string failure;
  if (archive) {
    const std::string dir = options_.runDir + "/checkpoints";
    ::mkdir(dir.c_str(), 0755);
    archive->write("epoch", at::tensor(epoch, at::kLong));
    archive->write("steps", at::tensor(s.steps, at::kLong));
    archive->write("rng", at::detail::getDefaultCPUGenerator().get_state());
    // Mid-epoch: the samples of the epoch's permutation read so far, which a
    // resume at another world size deals the rest from; the world size says
    // whether it is another (an elastic run's membership may have changed
    // within the epoch: it always resumes from `consumed`).
    archive->write("world_size", at::tensor(int64_t(worldSize()), at::kLong));
    archive->write("elastic", at::tensor(int64_t(s.rendezvous ? 1 : 0), at::kLong));
    if (batch > 0) {
      archive->write("consumed", at::tensor(s.consumed, at::kLong));
      archive->write("batch", at::tensor(batch, at::kLong));
      archive->write("partial", at::tensor(partial, at::kDouble));
    }
    const std::string finalPath = dir + "/" + (name.empty() ? checkpointFileName(epoch, batch) : name);
    if (!name.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(std::filesystem::path(finalPath).parent_path(), ec);
    }
    // This process's own: a writer cut off from the others (left out,
    // still writing) never shares a file with the one that replaced it.
    const std::string tmpPath = fmt::format("{}.{}.tmp", finalPath, ::getpid());
    const int fd = ::open(tmpPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int err = fd < 0 ? errno : 0;
    if (fd >= 0) {
      try {
        // After a failed write the rest is dropped but reported as written:
        // LibTorch's writer throws from its destructor (and so aborts) when
        // told of a short write. The failure is reported below.
        archive->save_to([&](const void* data, size_t n) -> size_t {
          size_t done = 0;
          while (err == 0 && done < n) {
            const ssize_t w = ::write(fd, static_cast<const char*>(data) + done, n - done);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) err = w < 0 ? errno : ENOSPC;
            else done += static_cast<size_t>(w);
          }
          return n;
        });
      } catch (const std::exception& e) {
        if (err == 0) failure = std::string(e.what()).substr(0, std::string(e.what()).find('\n'));
      }
      if (err == 0 && failure.empty() && ::fsync(fd) != 0) err = errno;
      if (::close(fd) != 0 && err == 0 && failure.empty()) err = errno;
    }
    // An elastic writer left out while it wrote (frozen, cut off) puts no
    // file over the one the others wrote without it.
    if (err == 0 && failure.empty() && s.rendezvous && !s.writesAlone) {
      try {
        if (!stillInGroup(*s.rendezvous, s.membership)()) failure = "the group went on without this rank meanwhile";
      } catch (const std::exception& e) {
        failure = errorLine(e);
      }
    }
    // rename() is atomic: readers see the old checkpoint or the new one, whole.
    if (err == 0 && failure.empty() && std::rename(tmpPath.c_str(), finalPath.c_str()) != 0) err = errno;
    if (err != 0 || !failure.empty()) {
      ::unlink(tmpPath.c_str());
      failure = fmt::format("checkpoint: cannot write {}: {}", finalPath, err != 0 ? errnoText(err) : failure);
    }
  }
  // The others wait while the writer writes: a slow disk gets ten minutes.
  // The writer, done, finds them waiting, so it waits for them only
  // distributed.timeout_s, as in any collective: a rank lost meanwhile
  // without a word (a cut link closes nothing) fails the save after the
  // timeout, and the job recovers or restarts, not ten minutes later.
  if (worldSize() > 1 && s.strategy) {
    const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(config_.distributed.timeoutSeconds * 1000));
    guardedSave(group(), s.rendezvous.get(), s.membership, timeout, fmt::format("rank 0 saved epoch {}", epoch),
                [&] { return group().barrier({archive ? timeout : kSlowDisk}); });
  }
  if (!failure.empty()) fail<std::runtime_error>("{}", failure);
  // Every rank: the signal path skips a checkpoint every rank already wrote.
  if (name.empty()) s.lastSaved = epoch;
  if (s.log) {
    s.log->line(fmt::format("checkpoint {}: training stood still {:.3f} s",
                            name.empty() ? checkpointFileName(epoch, batch) : name,
                            std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count()));
  }
}

void Trainer::loadShardedState(const std::string& path) {
  Impl& s = *impl_;
  std::string failure;
  try {
    ShardedCheckpoint checkpoint(path);
    loadHeldState(s.strategy->heldState(), s.strategy->optimizer(), checkpoint.reader());
  } catch (const std::exception& e) {
    failure = e.what();
    failure = fmt::format("checkpoint {} cannot be read ({})", path, failure.substr(0, failure.find('\n')));
  }
  const int world = worldSize();
  at::Tensor failed = at::tensor({failure.empty() ? int64_t(0) : int64_t(world - rank())}, at::kLong);
  if (world > 1) {
    AllreduceOptions max;
    max.op = ReduceOp::Max;
    group().allreduce(failed, max)->wait();
  }
  if (!failure.empty()) fail<std::runtime_error>("{}", failure);
  if (failed.item<int64_t>() != 0) {
    fail<std::runtime_error>("checkpoint {}: rank {} could not load its part of it", path,
                             world - failed.item<int64_t>());
  }
  s.strategy->afterStateLoaded();
}

// A sharded checkpoint (framework/checkpoint/sharded_checkpoint.hpp): rank
// 0 makes the folder, every rank writes its file, the ranks learn
// whether all of them succeeded, and rank 0 writes the index last. A
// failure anywhere leaves no index (so no checkpoint) and fails every rank,
// each naming its own error or the rank that failed.
void Trainer::writeShardedCheckpoint(int64_t epoch, int64_t batch, const std::vector<double>& partial,
                                     const std::string& name, bool background) {
  Impl& s = *impl_;
  const bool collective = worldSize() > 1 && s.strategy != nullptr;
  const int world = collective ? worldSize() : 1, me = collective ? rank() : 0;
  const bool writer = collective ? rank() == 0 : (isWriter() || s.writesAlone);
  if (!collective && !writer) return;
  std::string file = name.empty() ? checkpointFileName(epoch, batch, true) : name;
  if (file.size() > 3 && file.compare(file.size() - 3, 3, ".pt") == 0) file = file.substr(0, file.size() - 3) + ".shards";
  const std::string dir = options_.runDir + "/checkpoints/" + file;
  const BarrierOptions slowDisk{kSlowDisk};  // as the consolidated save gives rank 0
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(config_.distributed.timeoutSeconds * 1000));
  const std::string saving = fmt::format("the ranks saved their shards of epoch {}", epoch);

  // One id for this save on every rank: shards of two saves never mix.
  at::Tensor id = at::zeros({2}, at::kLong);
  if (writer) {
    id[0] = static_cast<int64_t>(std::random_device{}()) << 31 ^ static_cast<int64_t>(std::random_device{}());
    id[1] = s.steps;
  }
  std::string failure;
  if (writer) {
    try {
      // An earlier save of this point stays until this one's index
      // replaces it (its files have other names; the index removes them).
      std::error_code ec;
      std::filesystem::create_directories(dir, ec);
      if (ec) fail<std::runtime_error>("checkpoint: cannot create {}: {}", dir, ec.message());
    } catch (const std::exception& e) {
      failure = e.what();
    }
  }
  if (collective) {
    BroadcastOptions from;
    from.timeout = slowDisk.timeout;
    guardedSave(group(), s.rendezvous.get(), s.membership, timeout, saving, [&] { return group().broadcast(id, from); });
  }
  const std::string saveId = fmt::format("{:016x}-{}", static_cast<uint64_t>(id[0].item<int64_t>()), id[1].item<int64_t>());
  nlohmann::json meta{{"epoch", epoch},
                      {"steps", s.steps},
                      {"batch", batch},
                      {"partial", partial},
                      {"strategy", config_.distributed.strategy},
                      {"world_size", world}};
  if (batch > 0) meta["consumed"] = s.consumed;
  meta["elastic"] = s.rendezvous != nullptr;
  // An elastic rank 0 that was left out while it saved (frozen, cut off)
  // puts no index over the one the others wrote without it.
  std::function<bool()> stillCurrent;
  if (s.rendezvous && !s.writesAlone) stillCurrent = stillInGroup(*s.rendezvous, s.membership);
  if (background) {
    // A copy of what this rank holds, in host memory it owns: all that
    // training waits for. The write and (rank 0) the index follow on the
    // writer's thread; a failure there fails the job at a later step.
    if (!failure.empty()) fail<std::runtime_error>("{}", failure.substr(0, failure.find('\n')));
    HeldState held = s.strategy ? s.strategy->heldState() : wholeHeldState(*s.model, *s.releasedOptimizer, 1, 0);
    std::vector<StateSlice> slices =
        savedSlices(held, s.strategy ? s.strategy->optimizer() : *s.releasedOptimizer);
    // One copy, into the buffers of the previous background save where the
    // shapes match (writeCheckpoint waited for that save: they are free).
    const bool reuse = s.asyncStaging.size() == slices.size() &&
                       std::equal(slices.begin(), slices.end(), s.asyncStaging.begin(),
                                  [](const StateSlice& a, const at::Tensor& b) {
                                    return a.data.sizes() == b.sizes() && a.data.scalar_type() == b.scalar_type();
                                  });
    if (!reuse) s.asyncStaging.clear();
    for (size_t i = 0; i < slices.size(); ++i) {
      if (!reuse) {
        s.asyncStaging.push_back(at::empty(slices[i].data.sizes(), slices[i].data.options().device(at::kCPU)));
      }
      s.asyncStaging[i].copy_(slices[i].data);
      slices[i].data = s.asyncStaging[i];
    }
    if (writer) {
      at::Tensor rng = at::detail::getDefaultCPUGenerator().get_state();
      slices.push_back({"trainer/rng", {rng.numel()}, 0, rng.reshape({-1}).clone(), ""});
    }
    if (!s.asyncWriter) s.asyncWriter = std::make_unique<AsyncShardWriter>();
    s.asyncWriter->start(dir, me, world, saveId, std::move(slices), writer ? meta : nlohmann::json(),
                         std::chrono::milliseconds(static_cast<int64_t>(config_.distributed.timeoutSeconds * 1000)),
                         stillCurrent);
    if (name.empty()) s.lastSaved = epoch;
    return;
  }
  if (failure.empty()) {
    try {
      HeldState held = s.strategy ? s.strategy->heldState() : wholeHeldState(*s.model, *s.releasedOptimizer, 1, 0);
      // Training waits for this write: the live tensors are written as they are.
      std::vector<StateSlice> slices =
          savedSlices(held, s.strategy ? s.strategy->optimizer() : *s.releasedOptimizer);
      if (writer) {
        at::Tensor rng = at::detail::getDefaultCPUGenerator().get_state();
        slices.push_back({"trainer/rng", {rng.numel()}, 0, rng.reshape({-1}).clone(), ""});
      }
      writeShardFile(dir, me, saveId, slices);
    } catch (const std::exception& e) {
      failure = e.what();
    }
  }
  // Who failed, if anyone: the lowest failed rank + 1, else 0.
  at::Tensor failed = at::tensor({failure.empty() ? int64_t(0) : int64_t(world - me)}, at::kLong);
  if (collective) {
    AllreduceOptions max;
    max.op = ReduceOp::Max;
    max.timeout = slowDisk.timeout;
    guardedSave(group(), s.rendezvous.get(), s.membership, timeout, saving,
                [&] { return group().allreduce(failed, max); });
  }
  const int64_t failedRank = failed.item<int64_t>() == 0 ? -1 : world - failed.item<int64_t>();
  if (failedRank < 0 && writer) {
    try {
      writeShardIndex(dir, world, saveId, meta, stillCurrent);
    } catch (const std::exception& e) {
      failure = e.what();
    }
  }
  if (failedRank >= 0 || !failure.empty()) {
    if (writer) removeShardSave(dir, saveId);  // no index, no checkpoint: its files go too
    if (!failure.empty()) fail<std::runtime_error>("{}", failure.substr(0, failure.find('\n')));
    fail<std::runtime_error>("checkpoint: rank {} could not write its shard of {}", failedRank, dir);
  }
  // The index exists for every rank from here.
  if (collective) {
    guardedSave(group(), s.rendezvous.get(), s.membership, timeout, saving, [&] { return group().barrier(slowDisk); });
  }
  if (name.empty()) s.lastSaved = epoch;
}

}  // namespace ddp
