// Sharded checkpoints (sharded_checkpoint.hpp).
#include "framework/checkpoint/sharded_checkpoint.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <set>

#include "framework/core/errors.hpp"
#include "framework/core/system.hpp"
#include "framework/interop/safetensors.hpp"

namespace ddp {
namespace {

constexpr const char* kFormat = "ddp-sharded";
constexpr int kVersion = 1;

// For the crash tests: DDP_FAULT_SAVE=RANK:N:STAGE kills this process with
// SIGKILL at STAGE of its Nth sharded save, as a power cut or the OOM killer
// would. STAGE "shard": once this rank's shard file is synced and renamed;
// "index": once rank 0's index.json.tmp is synced, before its rename.
void crashPoint(const char* stage, int rank) {
  static const char* spec = std::getenv("DDP_FAULT_SAVE");
  if (spec == nullptr) return;
  static std::atomic<int> shardSaves{0}, indexSaves{0};
  const bool index = std::string(stage) == "index";
  const int nth = (index ? indexSaves : shardSaves).fetch_add(1) + 1;
  int faultRank = -1, faultSave = -1;
  char faultStage[16] = "";
  if (std::sscanf(spec, "%d:%d:%15s", &faultRank, &faultSave, faultStage) != 3) return;
  if (faultRank == rank && faultSave == nth && std::string(faultStage) == stage) {
    std::fprintf(stderr, "DDP_FAULT_SAVE: rank %d killed at the %s stage of save %d\n", rank, stage, nth);
    std::raise(SIGKILL);
  }
}

void syncPath(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail<std::runtime_error>("checkpoint: cannot open {} to sync it: {}", path, errnoText(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) fail<std::runtime_error>("checkpoint: cannot sync {}: {}", path, errnoText(err));
}

int64_t numelOf(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

struct FileSlice {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0, numel = 0;
  std::string scalar;
  at::ScalarType type;
  uint64_t begin = 0;
};

// A shard file's header: its save id and its slices.
std::pair<std::string, std::vector<FileSlice>> readShardHeader(const std::string& path) {
  const SafetensorsHeader header = readSafetensorsHeader(path);
  const auto bad = [&](const std::string& what) {
    fail<UsageError>("{}: not a shard of a ddp checkpoint: {}", path, what);
  };
  auto save = header.metadata.find("ddp.save");
  auto slices = header.metadata.find("ddp.slices");
  if (save == header.metadata.end() || slices == header.metadata.end()) bad("no ddp.save or ddp.slices metadata");
  const nlohmann::json described = nlohmann::json::parse(slices->second, nullptr, false);
  if (!described.is_object()) bad("ddp.slices is not a JSON object");
  std::vector<FileSlice> out;
  for (const SafetensorsEntry& entry : header.tensors) {
    if (!described.contains(entry.name)) bad(fmt::format("tensor {} is not described in ddp.slices", entry.name));
    const auto& d = described[entry.name];
    if (!d.is_object() || !d.contains("name") || !d.contains("shape") || !d.contains("offset")) {
      bad(fmt::format("ddp.slices entry {} lacks name, shape or offset", entry.name));
    }
    FileSlice slice;
    slice.name = d["name"].get<std::string>();
    slice.shape = d["shape"].get<std::vector<int64_t>>();
    slice.offset = d["offset"].get<int64_t>();
    slice.numel = numelOf(entry.sizes);
    slice.scalar = d.value("scalar", "");
    slice.type = entry.type;
    slice.begin = entry.begin;
    if (entry.sizes.size() != 1) bad(fmt::format("tensor {} is not 1-D", entry.name));
    if (slice.offset < 0 || slice.offset + slice.numel > numelOf(slice.shape)) {
      bad(fmt::format("{}'s range [{}, {}) lies outside its {} elements", slice.name, slice.offset,
                      slice.offset + slice.numel, numelOf(slice.shape)));
    }
    out.push_back(std::move(slice));
  }
  return {save->second, std::move(out)};
}

// The save id in DIR/index.json ("" without a readable one).
std::string indexedSave(const std::string& dir) {
  std::ifstream in(dir + "/index.json");
  if (!in) return "";
  const nlohmann::json index = nlohmann::json::parse(in, nullptr, false);
  if (index.is_discarded() || !index.is_object() || !index.contains("save") || !index["save"].is_string()) return "";
  return index["save"].get<std::string>();
}

// Removes the entries of DIR whose names `match`; never throws (a cleanup).
void removeEntries(const std::string& dir, const std::function<bool(const std::string&)>& match) {
  std::error_code ec;
  std::filesystem::directory_iterator it(dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code ignored;
    if (match(name)) std::filesystem::remove(it->path(), ignored);
  }
}

// A save's id as it goes into its files' names: the id itself where it is
// a short word of letters, digits, '_' and '-' (the trainer's are), else a
// hash of it.
std::string saveTag(const std::string& saveId) {
  const bool plain = !saveId.empty() && saveId.size() <= 64 &&
                     std::all_of(saveId.begin(), saveId.end(), [](char c) {
                       return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
                     });
  if (plain) return saveId;
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : saveId) h = (h ^ c) * 1099511628211ull;
  return fmt::format("h{:016x}", h);
}

// The files of saves other than `saveId` (an earlier save of this point,
// or a stale writer's), once this save's index is in place; not when the
// index is already another save's (a stale writer's index won the rename).
void removeOtherSaves(const std::string& dir, const std::string& saveId) {
  if (indexedSave(dir) != saveId) return;
  const std::string tag = "." + saveTag(saveId) + ".";
  removeEntries(dir, [&](const std::string& name) {
    const bool ours = name.rfind("rank_", 0) == 0 || name.rfind("index.json.", 0) == 0;
    return ours && name.find(tag) == std::string::npos;
  });
}

}  // namespace

std::string shardFileName(int rank, const std::string& saveId) {
  return fmt::format("rank_{:05}.{}.safetensors", rank, saveTag(saveId));
}

std::string shardFailureFileName(int rank, const std::string& saveId) {
  return fmt::format("rank_{:05}.{}.failed", rank, saveTag(saveId));
}

void removeShardSave(const std::string& dir, const std::string& saveId) {
  // A save whose index is in place is a checkpoint (its caller failed after
  // the rename, syncing the folder): its files stay.
  if (indexedSave(dir) == saveId) return;
  const std::string tag = "." + saveTag(saveId) + ".";
  removeEntries(dir, [&](const std::string& name) { return name.find(tag) != std::string::npos; });
  ::rmdir(dir.c_str());  // only if nothing else is left in it
}

bool isShardedCheckpoint(const std::string& path) {
  struct stat st {};
  return ::stat((path + "/index.json").c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

void writeShardFile(const std::string& dir, int rank, const std::string& saveId, const std::vector<StateSlice>& slices) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  NamedTensors tensors;
  nlohmann::json described = nlohmann::json::object();
  for (size_t i = 0; i < slices.size(); ++i) {
    const StateSlice& s = slices[i];
    const std::string key = fmt::format("t{}", i);
    nlohmann::json d{{"name", s.name}, {"shape", s.shape}, {"offset", s.offset}};
    if (!s.scalar.empty()) d["scalar"] = s.scalar;
    described[key] = d;
    tensors.emplace_back(key, s.data.reshape({-1}));
  }
  // writeSafetensors writes PATH.tmp, syncs it and renames it.
  writeSafetensors(dir + "/" + shardFileName(rank, saveId), tensors, {{"ddp.save", saveId}, {"ddp.slices", described.dump()}});
  crashPoint("shard", rank);
}

int64_t writeShardIndex(const std::string& dir, int files, const std::string& saveId, const nlohmann::json& meta,
                        const std::function<bool()>& stillCurrent) {
  struct Shard {
    int file;
    int64_t offset, numel;
    uint64_t begin;
  };
  struct Entry {
    at::ScalarType type;
    std::vector<int64_t> shape;
    std::string scalar;
    std::vector<Shard> shards;
  };
  std::map<std::string, Entry> tensors;
  nlohmann::json fileList = nlohmann::json::array();
  int64_t total = 0;
  for (int f = 0; f < files; ++f) {
    const std::string path = dir + "/" + shardFileName(f, saveId);
    auto [save, slices] = readShardHeader(path);
    if (save != saveId) {
      fail<std::runtime_error>("checkpoint: {} belongs to save {}, not to this one ({})", path, save, saveId);
    }
    const int64_t bytes = static_cast<int64_t>(std::filesystem::file_size(path));
    total += bytes;
    fileList.push_back({{"name", shardFileName(f, saveId)}, {"bytes", bytes}});
    for (FileSlice& s : slices) {
      auto [it, fresh] = tensors.try_emplace(s.name, Entry{s.type, s.shape, s.scalar, {}});
      if (!fresh && (it->second.type != s.type || it->second.shape != s.shape)) {
        fail<std::runtime_error>("checkpoint: ranks saved {} with different dtypes or shapes ({} [{}] and {} [{}])",
                                 s.name, c10::toString(it->second.type), fmt::join(it->second.shape, ","),
                                 c10::toString(s.type), fmt::join(s.shape, ","));
      }
      it->second.shards.push_back({f, s.offset, s.numel, s.begin});
    }
  }
  nlohmann::json index{{"format", kFormat}, {"version", kVersion}, {"save", saveId}, {"files", fileList},
                       {"meta", meta}};
  nlohmann::json described = nlohmann::json::object();
  for (auto& [name, entry] : tensors) {
    std::sort(entry.shards.begin(), entry.shards.end(),
              [](const Shard& a, const Shard& b) { return a.offset != b.offset ? a.offset < b.offset : a.numel < b.numel; });
    int64_t covered = 0;
    nlohmann::json shards = nlohmann::json::array();
    for (const Shard& s : entry.shards) {
      if (s.numel == 0 && entry.shards.size() > 1) continue;
      if (s.offset != covered) {
        fail<std::runtime_error>(
            "checkpoint: {} elements [{}, {}) of {} (a rank's shard missing, or a strategy whose ranks hold copies "
            "without saying so). HINT: training.checkpoint_format=consolidated saves it whole from rank 0",
            s.offset > covered ? "no rank saved" : "more than one rank saved", std::min(s.offset, covered),
            std::max(s.offset, covered), name);
      }
      covered += s.numel;
      shards.push_back({{"file", s.file}, {"offset", s.offset}, {"numel", s.numel}, {"begin", s.begin}});
    }
    if (covered != numelOf(entry.shape)) {
      fail<std::runtime_error>("checkpoint: no rank saved elements [{}, {}) of {}", covered, numelOf(entry.shape), name);
    }
    nlohmann::json d{{"dtype", safetensorsDtypeName(entry.type)}, {"shape", entry.shape}, {"shards", shards}};
    if (!entry.scalar.empty()) d["scalar"] = entry.scalar;
    described[name] = d;
  }
  index["tensors"] = described;
  const std::string path = dir + "/index.json", tmp = fmt::format("{}.{}.tmp", path, saveTag(saveId));
  {
    const std::string text = index.dump(1);
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) fail<std::runtime_error>("checkpoint: cannot create {}: {}", tmp, errnoText(errno));
    int err = writeFully(fd, text.data(), text.size());
    if (err == 0 && ::fsync(fd) != 0) err = errno;
    ::close(fd);
    if (err != 0) {
      ::unlink(tmp.c_str());
      fail<std::runtime_error>("checkpoint: cannot write {}: {}", tmp, errnoText(err));
    }
  }
  crashPoint("index", 0);  // rank 0 writes the index
  if (stillCurrent) {
    std::string unknown;  // stillCurrent could not tell
    bool current = false;
    try {
      current = stillCurrent();
    } catch (const std::exception& e) {
      const std::string what = e.what();
      unknown = what.substr(0, what.find('\n'));
    }
    if (!current) {
      ::unlink(tmp.c_str());
      if (!unknown.empty()) fail<std::runtime_error>("checkpoint: {}: index not written: {}", dir, unknown);
      fail<std::runtime_error>("checkpoint: {}: index not written: the group went on without this rank meanwhile", dir);
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    fail<std::runtime_error>("checkpoint: cannot rename {} to {}: {}", tmp, path, errnoText(errno));
  }
  syncPath(dir);
  removeOtherSaves(dir, saveId);
  return total;
}

struct ShardedCheckpoint::Impl {
  std::string dir;
  nlohmann::json index;
  struct Shard {
    int file;
    int64_t offset, numel;
    uint64_t begin;
  };
  struct Entry {
    at::ScalarType type;
    std::vector<int64_t> shape;
    std::string scalar;
    std::vector<Shard> shards;
  };
  std::map<std::string, Entry> tensors;
  std::vector<std::string> fileNames;
  std::vector<int64_t> fileBytes;
  mutable std::mutex mutex;
  mutable std::set<int> checked;

  std::string filePath(int f) const { return dir + "/" + fileNames[static_cast<size_t>(f)]; }
  void checkFile(int f) const {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (checked.count(f)) return;
    }
    const std::string path = filePath(f);
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
      fail<UsageError>("checkpoint {}: shard file {} is missing ({})", dir, path, errnoText(errno));
    }
    if (static_cast<int64_t>(st.st_size) != fileBytes[static_cast<size_t>(f)]) {
      fail<UsageError>("checkpoint {}: shard file {} has {} bytes, its index says {} (truncated or replaced)", dir, path,
                       static_cast<int64_t>(st.st_size), fileBytes[static_cast<size_t>(f)]);
    }
    const std::string save = readShardHeader(path).first;
    if (save != index["save"].get<std::string>()) {
      fail<UsageError>("checkpoint {}: shard file {} belongs to save {}, the index to save {} (shards of two saves)",
                       dir, path, save, index["save"].get<std::string>());
    }
    std::lock_guard<std::mutex> lock(mutex);
    checked.insert(f);
  }
  const Entry& entry(const std::string& name) const {
    auto it = tensors.find(name);
    if (it == tensors.end()) fail<UsageError>("checkpoint {}: no tensor {}", dir, name);
    return it->second;
  }
};

ShardedCheckpoint::ShardedCheckpoint(const std::string& dir) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.dir = dir;
  const std::string path = dir + "/index.json";
  std::ifstream in(path);
  if (!in) fail<UsageError>("checkpoint {}: cannot read {}", dir, path);
  s.index = nlohmann::json::parse(in, nullptr, false);
  const auto bad = [&](const std::string& what) {
    fail<UsageError>("checkpoint {}: {} is not a sharded checkpoint's index: {}", dir, path, what);
  };
  if (!s.index.is_object() || !s.index.contains("format") || !s.index["format"].is_string() ||
      s.index["format"].get<std::string>() != kFormat) {
    bad("no \"format\": \"ddp-sharded\"");
  }
  if (!s.index.contains("version") || !s.index["version"].is_number_integer() || s.index["version"] != kVersion) {
    bad(fmt::format("version {}, this build reads {}", s.index.contains("version") ? s.index["version"].dump() : "none",
                    kVersion));
  }
  if (!s.index.contains("save") || !s.index["save"].is_string() || !s.index.contains("files") ||
      !s.index["files"].is_array() || !s.index.contains("tensors") || !s.index["tensors"].is_object()) {
    bad("missing save, files or tensors");
  }
  try {
    for (const auto& f : s.index["files"]) {
      const std::string name = f.at("name").get<std::string>();
      if (name.empty() || name.find('/') != std::string::npos) bad("a file name with a folder in it");
      s.fileNames.push_back(name);
      s.fileBytes.push_back(f.at("bytes").get<int64_t>());
    }
    for (const auto& [name, d] : s.index["tensors"].items()) {
      auto type = safetensorsDtype(d.at("dtype").get<std::string>());
      if (!type) bad(fmt::format("tensor {} has dtype {}", name, d.at("dtype").dump()));
      Impl::Entry e{*type, d.at("shape").get<std::vector<int64_t>>(), d.value("scalar", ""), {}};
      for (const auto& sh : d.at("shards")) {
        const int file = sh.at("file").get<int>();
        if (file < 0 || file >= static_cast<int>(s.fileNames.size())) bad(fmt::format("tensor {} names file #{}", name, file));
        e.shards.push_back({file, sh.at("offset").get<int64_t>(), sh.at("numel").get<int64_t>(),
                            sh.at("begin").get<uint64_t>()});
      }
      s.tensors.emplace(name, std::move(e));
    }
  } catch (const nlohmann::json::exception& e) {
    bad(e.what());
  }
}

ShardedCheckpoint::~ShardedCheckpoint() = default;

const std::string& ShardedCheckpoint::path() const { return impl_->dir; }
const nlohmann::json& ShardedCheckpoint::meta() const {
  static const nlohmann::json empty = nlohmann::json::object();
  return impl_->index.contains("meta") ? impl_->index["meta"] : empty;
}
int ShardedCheckpoint::files() const { return static_cast<int>(impl_->fileNames.size()); }

std::string ShardedCheckpoint::filePath(int f) const {
  if (f < 0 || f >= files()) fail<UsageError>("checkpoint {}: no file #{} (it has {})", impl_->dir, f, files());
  return impl_->filePath(f);
}

std::string ShardedCheckpoint::saveId() const { return impl_->index["save"].get<std::string>(); }
int64_t ShardedCheckpoint::totalBytes() const {
  int64_t total = 0;
  for (int64_t b : impl_->fileBytes) total += b;
  return total;
}

void ShardedCheckpoint::verify() const {
  for (int f = 0; f < files(); ++f) impl_->checkFile(f);
}

bool ShardedCheckpoint::has(const std::string& name) const { return impl_->tensors.count(name) > 0; }

std::vector<std::string> ShardedCheckpoint::names() const {
  std::vector<std::string> out;
  for (const auto& item : impl_->tensors) out.push_back(item.first);
  return out;
}

std::vector<std::string> ShardedCheckpoint::entries(const std::string& prefix) const {
  std::vector<std::string> out;
  for (auto it = impl_->tensors.lower_bound(prefix); it != impl_->tensors.end() && it->first.rfind(prefix, 0) == 0; ++it)
    out.push_back(it->first);
  return out;
}

std::vector<int64_t> ShardedCheckpoint::shape(const std::string& name) const { return impl_->entry(name).shape; }
at::ScalarType ShardedCheckpoint::dtype(const std::string& name) const { return impl_->entry(name).type; }
std::string ShardedCheckpoint::scalar(const std::string& name) const { return impl_->entry(name).scalar; }

at::Tensor ShardedCheckpoint::read(const std::string& name, int64_t offset, int64_t numel) const {
  const Impl& s = *impl_;
  const Impl::Entry& e = s.entry(name);
  const int64_t total = numelOf(e.shape);
  if (offset < 0 || numel < 0 || offset + numel > total) {
    fail<UsageError>("checkpoint {}: elements [{}, {}) of {} asked for, it has {}", s.dir, offset, offset + numel, name,
                     total);
  }
  at::Tensor out = at::empty({numel}, at::TensorOptions().dtype(e.type));
  const size_t item = out.element_size();
  int64_t filled = 0;
  for (const Impl::Shard& sh : e.shards) {
    const int64_t from = std::max(offset, sh.offset), to = std::min(offset + numel, sh.offset + sh.numel);
    if (to <= from) continue;
    s.checkFile(sh.file);
    readFileRange(s.filePath(sh.file), static_cast<char*>(out.data_ptr()) + (from - offset) * item,
                  static_cast<size_t>(to - from) * item, sh.begin + static_cast<uint64_t>(from - sh.offset) * item);
    filled += to - from;
  }
  if (filled != numel) {
    fail<UsageError>("checkpoint {}: its shards hold {} of elements [{}, {}) of {}", s.dir, filled, offset,
                     offset + numel, name);
  }
  return out;
}

at::Tensor ShardedCheckpoint::readWhole(const std::string& name) const {
  const auto sizes = shape(name);
  return read(name, 0, numelOf(sizes)).view(sizes);
}

StateReader ShardedCheckpoint::reader() const {
  return StateReader{[this](const std::string& name) { return has(name); },
                     [this](const std::string& prefix) { return entries(prefix); },
                     [this](const std::string& name, int64_t offset, int64_t numel) { return read(name, offset, numel); }};
}

}  // namespace ddp
