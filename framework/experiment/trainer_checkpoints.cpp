// The Trainer's checkpoint writing (trainer.hpp): atomically, with a full disk named as such.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/serialize.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "framework/core/errors.hpp"
#include "framework/core/system.hpp"
#include "framework/experiment/run_folder.hpp"
#include "framework/experiment/trainer_impl.hpp"

namespace ddp {

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
    if (s.rendezvous && batch > 0) archive->write("consumed", at::tensor(s.consumed, at::kLong));
    if (batch > 0) {
      archive->write("batch", at::tensor(batch, at::kLong));
      archive->write("partial", at::tensor(partial, at::kDouble));
    }
    const std::string finalPath = dir + "/" + (name.empty() ? checkpointFileName(epoch, batch) : name);
    if (!name.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(std::filesystem::path(finalPath).parent_path(), ec);
    }
    const std::string tmpPath = finalPath + ".tmp";
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
    // rename() is atomic: readers see the old checkpoint or the new one, whole.
    if (err == 0 && failure.empty() && std::rename(tmpPath.c_str(), finalPath.c_str()) != 0) err = errno;
    if (err != 0 || !failure.empty()) {
      ::unlink(tmpPath.c_str());
      failure = fmt::format("checkpoint: cannot write {}: {}", finalPath, err != 0 ? errnoText(err) : failure);
    }
  }
  // The others wait while rank 0 writes; a slow disk gets ten minutes.
  if (worldSize() > 1 && s.strategy) group().barrier({std::chrono::milliseconds(600000)})->wait();
  if (!failure.empty()) fail<std::runtime_error>("{}", failure);
  // Every rank: the signal path skips a checkpoint every rank already wrote.
  if (name.empty()) s.lastSaved = epoch;
}

}  // namespace ddp
