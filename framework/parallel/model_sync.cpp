#include "framework/parallel/model_sync.hpp"

#include <ATen/ATen.h>
#include <torch/nn/modules/embedding.h>

#include <cstring>
#include <exception>
#include <map>
#include <set>
#include <sstream>
#include <unordered_set>

#include "framework/core/errors.hpp"

namespace ddp {

namespace {

// Broadcasts at construction are coalesced into flat tensors of at most this
// size: few collectives, bounded extra memory.
constexpr size_t kBroadcastChunkBytes = 64u * 1024 * 1024;

int64_t bytesIn(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

// A dense, contiguous CPU tensor whose bytes memcpy may read and write.
bool plainHostMemory(const at::Tensor& t) {
  return t.device().is_cpu() && t.layout() == at::kStrided && t.is_contiguous() && !t.is_conj() && !t.is_neg();
}

std::string shapeString(at::IntArrayRef sizes) {
  std::string s = "[";
  for (size_t i = 0; i < sizes.size(); ++i) s += (i ? ", " : "") + std::to_string(sizes[i]);
  return s + "]";
}

// One line per parameter or buffer; what must agree across ranks.
struct TensorSpec {
  char kind = 'P';  // 'P' parameter, 'B' buffer
  std::string name;
  std::string dtype;
  std::string shape;
  bool requiresGrad = false;

  bool operator==(const TensorSpec& o) const {
    return kind == o.kind && name == o.name && dtype == o.dtype && shape == o.shape && requiresGrad == o.requiresGrad;
  }
  const char* kindWord() const { return kind == 'P' ? "parameter" : "buffer"; }
};

std::string serialize(const std::vector<TensorSpec>& specs) {
  std::string out;
  for (const auto& s : specs) {
    out += std::string(1, s.kind) + '\t' + s.name + '\t' + s.dtype + '\t' + s.shape + '\t' +
           (s.requiresGrad ? "1" : "0") + '\n';
  }
  return out;
}

std::vector<TensorSpec> parse(const std::string& text) {
  std::vector<TensorSpec> specs;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    std::vector<std::string> fields;
    size_t start = 0;
    for (size_t tab; (tab = line.find('\t', start)) != std::string::npos; start = tab + 1)
      fields.push_back(line.substr(start, tab - start));
    fields.push_back(line.substr(start));
    DDP_CHECK(fields.size() == 5, fmt::format("malformed model description line: {}", line));
    specs.push_back({fields[0][0], fields[1], fields[2], fields[3], fields[4] == "1"});
  }
  return specs;
}

uint64_t fingerprint(const std::string& text) {
  uint64_t h = 14695981039346656037ull;  // FNV-1a
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h;
}

// The first difference between rank 0's model and rank r's, as one line.
std::string describeMismatch(const std::string& who, const std::vector<TensorSpec>& base, const std::vector<TensorSpec>& other, int r) {
  std::map<std::string, const TensorSpec*> byName;
  for (const auto& s : other) byName[s.name] = &s;
  // Differences in a tensor both ranks have are the most telling: check
  // those in rank 0's order first.
  for (const auto& s : base) {
    auto it = byName.find(s.name);
    if (it == byName.end()) continue;
    const TensorSpec& o = *it->second;
    if (s.kind != o.kind) return fmt::format("{}: '{}' is a {} on rank 0 but a {} on rank {}", who, s.name, s.kindWord(), o.kindWord(), r);
    if (s.shape != o.shape)
      return fmt::format("{}: {} '{}' has shape {} on rank 0 but {} on rank {}", who, s.kindWord(), s.name, s.shape, o.shape, r);
    if (s.dtype != o.dtype)
      return fmt::format("{}: {} '{}' has dtype {} on rank 0 but {} on rank {}", who, s.kindWord(), s.name, s.dtype, o.dtype, r);
    if (s.requiresGrad != o.requiresGrad)
      return fmt::format("{}: {} '{}' has requires_grad {} on rank 0 but {} on rank {}", who, s.kindWord(), s.name,
                         s.requiresGrad, o.requiresGrad, r);
  }
  std::set<std::string> baseNames;
  for (const auto& s : base) baseNames.insert(s.name);
  for (const auto& s : base)
    if (!byName.count(s.name)) return fmt::format("{}: {} '{}' exists on rank 0 but not on rank {}", who, s.kindWord(), s.name, r);
  for (const auto& s : other)
    if (!baseNames.count(s.name)) return fmt::format("{}: {} '{}' exists on rank {} but not on rank 0", who, s.kindWord(), s.name, r);
  for (size_t i = 0; i < std::min(base.size(), other.size()); ++i) {
    if (!(base[i] == other[i]))
      return fmt::format("{}: tensors are registered in a different order on rank 0 and rank {} (#{} is '{}' vs '{}')", who,
                         r, i, base[i].name, other[i].name);
  }
  return fmt::format("{}: rank 0 and rank {} describe their models differently", who, r);
}

// Parameters and buffers without duplicates: a tensor shared by two
// submodules is registered twice but must be hooked and broadcast once.
template <typename Items>
std::vector<std::pair<std::string, at::Tensor>> uniqueTensors(const Items& items) {
  std::unordered_set<const void*> seen;
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : items) {
    if (!item.value().defined()) continue;
    if (!seen.insert(item.value().unsafeGetTensorImpl()).second) continue;
    out.emplace_back(item.key(), item.value());
  }
  return out;
}

}  // namespace

std::vector<std::pair<std::string, at::Tensor>> uniqueParameters(const torch::nn::Module& module) {
  return uniqueTensors(module.named_parameters(true));
}

std::vector<std::pair<std::string, at::Tensor>> uniqueBuffers(const torch::nn::Module& module) {
  return uniqueTensors(module.named_buffers(true));
}

void verifySameModel(ProcessGroup& group, const torch::nn::Module& module, const std::string& who,
                     Milliseconds timeout) {
  std::vector<TensorSpec> specs;
  for (auto& [name, p] : uniqueParameters(module))
    specs.push_back({'P', name, dtypeName(p), shapeString(p.sizes()), p.requires_grad()});
  for (auto& [name, b] : uniqueBuffers(module))
    specs.push_back({'B', name, dtypeName(b), shapeString(b.sizes()), false});
  const int world = group.size();
  if (world == 1) return;
  const std::string mine = serialize(specs);

  // Cheap common case: one 8-byte fingerprint per rank.
  at::Tensor fp = at::empty({1}, at::kLong);
  fp[0] = static_cast<int64_t>(fingerprint(mine));
  at::Tensor fps = at::empty({world}, at::kLong);
  group.allgather(fp, fps, {timeout})->wait();
  bool allEqual = true;
  for (int r = 1; r < world; ++r) allEqual = allEqual && fps[r].item<int64_t>() == fps[0].item<int64_t>();
  if (allEqual) return;

  // Some rank differs: exchange the full descriptions so every rank can
  // name the difference.
  std::vector<std::vector<TensorSpec>> perRank;
  for (const std::string& text : allgatherStrings(group, mine, timeout)) perRank.push_back(parse(text));
  for (int r = 1; r < world; ++r) {
    if (perRank[r] == perRank[0]) continue;
    fail<UsageError>("{}. HINT: every rank must build the same model from the same configuration",
                     describeMismatch(who, perRank[0], perRank[r], r));
  }
  DDP_CHECK(false, "model fingerprints differ but descriptions agree");
}

std::vector<std::string> allgatherStrings(ProcessGroup& group, const std::string& mine, Milliseconds timeout) {
  const int world = group.size();
  at::Tensor length = at::full({1}, static_cast<int64_t>(mine.size()), at::kLong);
  at::Tensor lengths = at::empty({world}, at::kLong);
  group.allgather(length, lengths, {timeout})->wait();
  const int64_t words = (lengths.max().item<int64_t>() + 7) / 8;
  std::vector<std::string> out(world);
  if (words == 0) return out;
  at::Tensor packed = at::zeros({words}, at::kLong);
  std::memcpy(packed.data_ptr(), mine.data(), mine.size());
  at::Tensor all = at::empty({words * world}, at::kLong);
  group.allgather(packed, all, {timeout})->wait();
  for (int r = 0; r < world; ++r) {
    out[r].assign(reinterpret_cast<const char*>(all.data_ptr<int64_t>() + r * words),
                  static_cast<size_t>(lengths[r].item<int64_t>()));
  }
  return out;
}

PackedBroadcast::PackedBroadcast(const std::vector<at::Tensor>& tensors) : tensors_(tensors) { plan(); }

bool PackedBroadcast::planStillFits() const {
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const at::Tensor& t = tensors_[i];
    const Member& m = planned_[i];
    if (bytesIn(t) != m.bytes || t.scalar_type() != m.dtype || t.device() != m.device) return false;
  }
  return true;
}

void PackedBroadcast::plan() {
  chunks_.clear();
  planned_.clear();
  for (const auto& t : tensors_) planned_.push_back({bytesIn(t), t.scalar_type(), t.device()});
  // Packed as bytes, whatever their dtypes (so batch norm's float
  // statistics and its int64 counter are one collective, not two), by
  // device, in order, each at a 16-byte aligned offset, cut into chunks.
  constexpr int64_t kAlign = 16;
  std::map<std::string, size_t> open;  // device -> index into chunks_
  for (const auto& t : tensors_) {
    if (t.numel() == 0) continue;
    const int64_t bytes = bytesIn(t);
    auto it = open.find(t.device().str());
    if (it == open.end() || (chunks_[it->second].bytes + bytes > static_cast<int64_t>(kBroadcastChunkBytes) &&
                             chunks_[it->second].bytes > 0)) {
      chunks_.emplace_back();
      it = open.insert_or_assign(t.device().str(), chunks_.size() - 1).first;
    }
    Chunk& chunk = chunks_[it->second];
    chunk.members.push_back(t);
    chunk.offsets.push_back(chunk.bytes);
    chunk.bytes += (bytes + kAlign - 1) / kAlign * kAlign;
  }
}

void PackedBroadcast::run(ProcessGroup& group, Milliseconds timeout) {
  if (group.size() == 1) return;
  if (!planStillFits()) plan();
  if (chunks_.empty()) return;
  at::NoGradGuard noGrad;
  auto bytesOf = [](const at::Tensor& t) { return t.detach().reshape({-1}).contiguous().view(at::kByte); };
  std::vector<WorkPtr> works;
  for (auto& chunk : chunks_) {
    if (!chunk.flat.defined()) {
      // Zero-filled once: the padding between members stays zero.
      chunk.flat = at::zeros({chunk.bytes}, chunk.members.front().options().dtype(at::kByte));
      // Sent as int32 words (every backend has them; the length is a
      // multiple of 16 bytes): the same bytes.
      chunk.words = chunk.flat.view(at::kInt);
    }
    if (group.rank() == 0) {
      for (size_t m = 0; m < chunk.members.size(); ++m) {
        const at::Tensor& t = chunk.members[m];
        if (plainHostMemory(t)) {
          // A plain copy: DDP broadcasts its buffers every step, and the
          // ATen ops of the general path cost more than the bytes do.
          std::memcpy(static_cast<char*>(chunk.flat.data_ptr()) + chunk.offsets[m], t.data_ptr(), bytesIn(t));
          continue;
        }
        const at::Tensor b = bytesOf(t);
        chunk.flat.narrow(0, chunk.offsets[m], b.numel()).copy_(b);
      }
    }
    works.push_back(group.broadcast(chunk.words, {0, timeout}));
  }
  // Every chunk is waited for, even after one failed, so that no collective
  // still writes into a flat when the error reaches the caller.
  std::exception_ptr failed;
  for (auto& work : works) {
    try {
      work->wait();
    } catch (...) {
      if (!failed) failed = std::current_exception();
    }
  }
  if (failed) std::rethrow_exception(failed);
  if (group.rank() == 0) return;
  for (auto& chunk : chunks_) {
    for (size_t m = 0; m < chunk.members.size(); ++m) {
      at::Tensor& t = chunk.members[m];
      const int64_t bytes = bytesIn(t);
      if (plainHostMemory(t)) {
        std::memcpy(t.data_ptr(), static_cast<const char*>(chunk.flat.data_ptr()) + chunk.offsets[m], bytes);
        continue;
      }
      const at::Tensor values = chunk.flat.narrow(0, chunk.offsets[m], bytes).view(t.scalar_type());
      t.detach().copy_(values.view(t.sizes()));
    }
  }
}

void broadcastFromRankZero(ProcessGroup& group, const std::vector<at::Tensor>& tensors, Milliseconds timeout) {
  if (group.size() == 1) return;
  PackedBroadcast(tensors).run(group, timeout);
}

std::vector<std::pair<std::string, at::Tensor>> shardableParameters(const torch::nn::Module& module,
                                                                    const char* who) {
  // Sparse gradients would only show at the first step: refuse them now.
  for (const auto& item : module.named_modules("", /*include_self=*/true)) {
    const torch::nn::Module& m = *item.value();
    bool sparse = false;
    if (auto* e = dynamic_cast<const torch::nn::EmbeddingImpl*>(&m)) sparse = e->options.sparse();
    if (auto* e = dynamic_cast<const torch::nn::EmbeddingBagImpl*>(&m)) sparse = e->options.sparse();
    if (sparse) {
      fail<UsageError>("{}: module '{}' is an embedding with sparse gradients; {} reduces dense gradients. HINT: "
                       "build it with sparse(false), or use distributed.strategy=ddp",
                       who, item.key(), who);
    }
  }
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (auto& [name, p] : uniqueParameters(module)) {
    if (!p.requires_grad()) continue;
    if (!out.empty() && p.scalar_type() != out.front().second.scalar_type()) {
      fail<UsageError>("{}: parameter '{}' is {} but '{}' is {}; it shards one flat buffer of one dtype. "
                       "HINT: cast the model to one dtype, or use distributed.strategy=ddp",
                       who, name, dtypeName(p), out.front().first, dtypeName(out.front().second));
    }
    if (!at::isFloatingType(p.scalar_type())) {
      fail<UsageError>("{}: parameter '{}' is {}; only floating-point parameters can be trained", who, name,
                       dtypeName(p));
    }
    out.emplace_back(name, p);
  }
  return out;
}

}  // namespace ddp
