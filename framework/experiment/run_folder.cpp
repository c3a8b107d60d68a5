#include "framework/experiment/run_folder.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "framework/checkpoint/sharded_checkpoint.hpp"
#include "framework/core/errors.hpp"
#include "framework/core/system.hpp"

namespace ddp {
namespace {

// Reads digits at name[pos...]; false when there are none.
bool readNumber(const std::string& name, size_t* pos, int64_t* out) {
  size_t end = *pos;
  while (end < name.size() && name[end] >= '0' && name[end] <= '9') ++end;
  if (end == *pos || end - *pos > 18) return false;
  *out = std::strtoll(name.c_str() + *pos, nullptr, 10);
  *pos = end;
  return true;
}

bool parseCheckpointName(const std::string& name, CheckpointFile* out) {
  const std::string epochPrefix = "epoch_", batchPrefix = "_batch_";
  if (name.rfind(epochPrefix, 0) != 0) return false;
  size_t pos = epochPrefix.size();
  if (!readNumber(name, &pos, &out->epoch)) return false;
  out->batch = 0;
  if (name.compare(pos, batchPrefix.size(), batchPrefix) == 0) {
    pos += batchPrefix.size();
    // epoch_E_batch_B: B batches into epoch E (1-based, as the messages
    // count), so E - 1 epochs finished.
    if (!readNumber(name, &pos, &out->batch) || out->epoch < 1 || out->batch < 1) return false;
    out->epoch -= 1;
  }
  return name.compare(pos, std::string::npos, ".pt") == 0 || name.compare(pos, std::string::npos, ".shards") == 0;
}

// A sharded checkpoint is one only once its index exists (a save cut short
// leaves a folder without one).
bool complete(const std::string& path) {
  return path.size() < 7 || path.compare(path.size() - 7, 7, ".shards") != 0 || isShardedCheckpoint(path);
}

std::string hostName() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) return "?";
  return host;
}

}  // namespace

std::vector<CheckpointFile> listCheckpoints(const std::string& runDir) {
  const std::string dir = runDir + "/checkpoints";
  std::vector<CheckpointFile> found;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return found;
  while (dirent* e = ::readdir(d)) {
    CheckpointFile file;
    if (parseCheckpointName(e->d_name, &file) && complete(dir + "/" + e->d_name)) {
      file.path = dir + "/" + e->d_name;
      found.push_back(std::move(file));
    }
  }
  ::closedir(d);
  std::sort(found.begin(), found.end(), [](const CheckpointFile& a, const CheckpointFile& b) {
    if (a.epoch != b.epoch) return a.epoch > b.epoch;
    if (a.batch != b.batch) return a.batch > b.batch;
    return a.path < b.path;
  });
  return found;
}

std::string newestCheckpoint(const std::string& runDir) {
  const auto all = listCheckpoints(runDir);
  return all.empty() ? "" : all.front().path;
}

std::vector<BestCheckpoint> listBestCheckpoints(const std::string& runDir) {
  std::vector<BestCheckpoint> found;
  const std::string dir = runDir + "/checkpoints/best";
  DIR* d = ::opendir(dir.c_str());
  if (!d) return found;
  while (dirent* e = ::readdir(d)) {
    CheckpointFile file;
    if (parseCheckpointName(e->d_name, &file) && file.batch == 0 && complete(dir + "/" + e->d_name)) found.push_back({file.epoch, dir + "/" + e->d_name});
  }
  ::closedir(d);
  std::sort(found.begin(), found.end(),
            [](const BestCheckpoint& a, const BestCheckpoint& b) { return a.epoch < b.epoch; });
  return found;
}

std::vector<BestCheckpoint> indexedBestCheckpoints(const std::string& runDir) {
  std::vector<BestCheckpoint> out;
  const std::string indexPath = runDir + "/checkpoints/best/index.json";
  std::ifstream in(indexPath);
  if (!in) return out;
  const nlohmann::json index = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!index.is_object() || !index.contains("best") || !index["best"].is_array()) {
    fail<UsageError>("{}: not a best-checkpoint index (expected {{\"best\": [...]}}). HINT: remove it; training "
                     "with training.keep_best writes it anew",
                     indexPath);
  }
  for (const auto& entry : index["best"]) {
    if (!entry.is_object() || !entry.contains("file") || !entry["file"].is_string() || !entry.contains("epoch") ||
        !entry["epoch"].is_number_integer()) {
      continue;
    }
    const std::string file = entry["file"].get<std::string>();
    if (file.empty() || file.front() == '/' || file.find("..") != std::string::npos) {
      fail<UsageError>("{}: entry {} leaves the run's checkpoints/ folder. HINT: remove the file; training with "
                       "training.keep_best writes it anew",
                       indexPath, file);
    }
    out.push_back({entry["epoch"].get<int64_t>(), runDir + "/checkpoints/" + file});
  }
  return out;
}

std::string bestCheckpoint(const std::string& runDir) {
  for (const BestCheckpoint& b : indexedBestCheckpoints(runDir)) {
    if (::access(b.path.c_str(), R_OK) == 0) return b.path;
  }
  return "";
}

std::string checkpointFileName(int64_t epoch, int64_t batch, bool sharded) {
  const char* suffix = sharded ? ".shards" : ".pt";
  return batch > 0 ? fmt::format("epoch_{:06}_batch_{:06}{}", epoch + 1, batch, suffix)
                   : fmt::format("epoch_{:06}{}", epoch, suffix);
}

RunFolderLock::RunFolderLock(const std::string& runDir) {
  const std::string path = runDir + "/.lock";
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) fail<UsageError>("cannot lock run folder {}: {}: {}", runDir, path, errnoText(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char owner[300] = {};
    const ssize_t n = ::pread(fd_, owner, sizeof(owner) - 1, 0);
    ::close(fd_);
    fd_ = -1;
    if (err != EWOULDBLOCK) fail<UsageError>("cannot lock run folder {}: {}: {}", runDir, path, errnoText(err));
    std::string pid = "?", host = "?";
    if (n > 0) {
      std::string text(owner, static_cast<size_t>(n));
      const size_t space = text.find(' ');
      pid = text.substr(0, space);
      if (space != std::string::npos) host = text.substr(space + 1);
      while (!host.empty() && (host.back() == '\n' || host.back() == ' ')) host.pop_back();
    }
    fail<UsageError>("run folder {} is in use by pid {} (host {}). HINT: wait for that job to end, or use another --out",
                     runDir, pid, host);
  }
  const std::string owner = fmt::format("{} {}\n", ::getpid(), hostName());
  if (::ftruncate(fd_, 0) == 0) {
    [[maybe_unused]] const ssize_t n = ::pwrite(fd_, owner.data(), owner.size(), 0);
  }
}

RunFolderLock::~RunFolderLock() {
  if (fd_ >= 0) ::close(fd_);
}

void checkWritable(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) fail<UsageError>("cannot create {}: {}. HINT: choose a writable --out", dir, ec.message());
  const std::string probe = fmt::format("{}/.write-probe-{}", dir, ::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  int err = fd < 0 ? errno : 0;
  if (fd >= 0) {
    if (::write(fd, "x", 1) != 1) err = errno == 0 ? ENOSPC : errno;
    ::close(fd);
    ::unlink(probe.c_str());
  }
  if (err != 0) fail<UsageError>("{} is not writable: {}. HINT: choose a writable --out", dir, errnoText(err));
}

}  // namespace ddp
