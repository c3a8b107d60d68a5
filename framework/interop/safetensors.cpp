// safetensors files (safetensors.hpp).
#include "framework/interop/safetensors.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <c10/util/accumulate.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

#include "framework/core/errors.hpp"
#include "framework/core/strings.hpp"
#include "framework/core/system.hpp"

namespace ddp {
namespace {

// The format's own limit on the header, which keeps a hostile length from
// allocating gigabytes.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// More dimensions than any tensor has; a longer shape is a hostile header.
constexpr size_t kMaxDims = 64;
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors data is little-endian; so must the host be");

struct DtypeName {
  const char* name;
  at::ScalarType type;
};
constexpr DtypeName kDtypes[] = {
    {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf},  {"BF16", at::kBFloat16}, {"I64", at::kLong},
    {"I32", at::kInt},    {"I16", at::kShort}, {"I8", at::kChar},   {"U8", at::kByte},       {"BOOL", at::kBool},
};

std::string dtypeName(at::ScalarType type, const std::string& tensor) {
  for (const auto& d : kDtypes) {
    if (d.type == type) return d.name;
  }
  fail<UsageError>("safetensors: tensor {} has dtype {}, which this writer does not handle", tensor,
                   c10::toString(type));
}

// A file descriptor closed on scope exit.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

void writeAll(int fd, const void* data, size_t n, const std::string& path) {
  if (const int err = writeFully(fd, data, n)) fail<std::runtime_error>("{}: cannot write: {}", path, errnoText(err));
}

// Reads exactly n bytes at `offset`; false at the end of the file.
bool readAt(int fd, void* data, size_t n, uint64_t offset, const std::string& path) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, std::min<size_t>(n, size_t{1} << 30), static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) fail<UsageError>("{}: cannot read: {}", path, errnoText(errno));
    if (r == 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return true;
}

uint64_t littleEndian64(const unsigned char* b) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | b[i];
  return v;
}

}  // namespace

void writeSafetensorsStreamed(const std::string& path, const std::vector<TensorLayout>& layout,
                              const TensorSource& tensor, const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [key, value] : metadata) meta[key] = value;
    header["__metadata__"] = meta;
  }
  uint64_t offset = 0;
  for (const TensorLayout& t : layout) {
    if (t.name == "__metadata__" || header.contains(t.name)) {
      fail<UsageError>("safetensors: tensor name {} is {}", t.name,
                       t.name == "__metadata__" ? "reserved for the header's metadata" : "given twice");
    }
    const uint64_t bytes = static_cast<uint64_t>(c10::multiply_integers(t.shape)) * c10::elementSize(t.dtype);
    header[t.name] = {{"dtype", dtypeName(t.dtype, t.name)}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  unsigned char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(uint64_t(text.size()) >> (8 * i));

  const std::string tmp = path + ".tmp";
  Fd out{::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)};
  if (out.fd < 0) fail<UsageError>("{}: cannot create: {}", tmp, errnoText(errno));
  try {
    writeAll(out.fd, length, sizeof length, tmp);
    writeAll(out.fd, text.data(), text.size(), tmp);
    for (size_t i = 0; i < layout.size(); ++i) {
      const at::Tensor t = tensor(i).detach().to(at::kCPU).contiguous();
      if (t.scalar_type() != layout[i].dtype || t.sizes().vec() != layout[i].shape) {
        fail<std::runtime_error>("safetensors {}: tensor {} came as {} [{}], where the header says {} [{}]", path,
                                 layout[i].name, c10::toString(t.scalar_type()), fmt::join(t.sizes(), ", "),
                                 c10::toString(layout[i].dtype), fmt::join(layout[i].shape, ", "));
      }
      writeAll(out.fd, t.data_ptr(), static_cast<size_t>(t.numel()) * t.element_size(), tmp);
    }
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  if (::fsync(out.fd) != 0 || ::close(out.fd) != 0) {
    out.fd = -1;
    ::unlink(tmp.c_str());
    fail<std::runtime_error>("{}: cannot write: {}", tmp, errnoText(errno));
  }
  out.fd = -1;
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    fail<UsageError>("{}: cannot rename {} to it: {}", path, tmp, errnoText(errno));
  }
}

void writeSafetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::vector<TensorLayout> layout;
  for (const auto& [name, tensor] : tensors) layout.push_back({name, tensor.scalar_type(), tensor.sizes().vec()});
  writeSafetensorsStreamed(path, layout, [&](size_t i) { return tensors[i].second; }, metadata);
}

bool looksLikeSafetensors(const std::string& path) {
  Fd in{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (in.fd < 0) return false;
  unsigned char head[9];
  if (!readAt(in.fd, head, sizeof head, 0, path)) return false;
  const uint64_t n = littleEndian64(head);
  return n >= 2 && n <= kMaxHeaderBytes && head[8] == '{';
}

SafetensorsHeader readSafetensorsHeader(const std::string& path) {
  Fd in{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (in.fd < 0) fail<UsageError>("{}: cannot open: {}", path, errnoText(errno));
  struct stat st {};
  if (::fstat(in.fd, &st) != 0) fail<UsageError>("{}: cannot read: {}", path, errnoText(errno));
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  const auto bad = [&](const std::string& what) {
    fail<UsageError>("{}: not a valid safetensors file: {}", path, what);
  };
  unsigned char length[8];
  if (size < 8 || !readAt(in.fd, length, 8, 0, path)) bad(fmt::format("{} bytes, fewer than the 8 of a header length", size));
  const uint64_t headerBytes = littleEndian64(length);
  if (headerBytes > kMaxHeaderBytes) {
    bad(fmt::format("the header claims {} bytes, above the format's limit of {}", headerBytes, kMaxHeaderBytes));
  }
  if (headerBytes > size - 8) {
    bad(fmt::format("the header claims {} bytes, but the file has {} after the length", headerBytes, size - 8));
  }
  std::string text(static_cast<size_t>(headerBytes), '\0');
  if (!readAt(in.fd, text.data(), text.size(), 8, path)) bad("the file ends inside the header");
  const nlohmann::json header = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!header.is_object()) bad("the header is not a JSON object");
  const uint64_t dataStart = 8 + headerBytes, dataBytes = size - dataStart;

  SafetensorsHeader out;
  out.fileBytes = size;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) bad("__metadata__ is not an object");
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) bad(fmt::format("__metadata__.{} is not a string", printable(key)));
        out.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    const std::string shownName = printable(name);
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets")) {
      bad(fmt::format("tensor {} lacks dtype, shape or data_offsets", shownName));
    }
    const auto& dtype = entry["dtype"];
    const DtypeName* found = nullptr;
    for (const auto& d : kDtypes) {
      if (dtype.is_string() && dtype.get<std::string>() == d.name) found = &d;
    }
    if (!found) {
      bad(fmt::format("tensor {} has dtype {}; handled: F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL", shownName,
                      dtype.is_string() ? "\"" + printable(dtype.get<std::string>()) + "\"" : std::string("of JSON type ") + dtype.type_name()));
    }
    const auto& shape = entry["shape"];
    const auto& offsets = entry["data_offsets"];
    if (!shape.is_array() || !offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned()) {
      bad(fmt::format("tensor {}: shape must be a list and data_offsets two numbers", shownName));
    }
    if (shape.size() > kMaxDims) bad(fmt::format("tensor {}: a shape of {} dimensions", shownName, shape.size()));
    std::vector<int64_t> sizes;
    uint64_t numel = 1, nonzero = 1;  // nonzero: the product of the other sizes, which must not overflow either
    for (const auto& d : shape) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max())) {
        bad(fmt::format("tensor {}: a shape that holds something other than sizes", shownName));
      }
      const uint64_t dim = d.get<uint64_t>();
      if (dim != 0 && numel > dataBytes / dim) numel = dataBytes + 1;  // more than the file can hold
      else numel *= dim;
      if (dim != 0 && nonzero > (uint64_t(1) << 62) / dim) bad(fmt::format("tensor {}: a shape whose size overflows", shownName));
      if (dim != 0) nonzero *= dim;
      sizes.push_back(static_cast<int64_t>(dim));
    }
    const uint64_t begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
    const uint64_t itemSize = c10::elementSize(found->type);
    if (begin > end || end > dataBytes) {
      bad(fmt::format("tensor {}: data_offsets [{}, {}] lie outside the {} bytes of data", shownName, begin, end,
                      dataBytes));
    }
    if (numel > dataBytes || numel * itemSize != end - begin) {
      bad(fmt::format("tensor {}: shape [{}] of {} needs {} bytes, data_offsets give {}", shownName,
                      fmt::join(sizes, ","), found->name, numel > dataBytes ? std::string("more than the file's") : std::to_string(numel * itemSize),
                      end - begin));
    }
    out.tensors.push_back({name, found->type, std::move(sizes), dataStart + begin, dataStart + end});
  }
  // Tensors in file order; none may overlap another.
  std::sort(out.tensors.begin(), out.tensors.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < out.tensors.size(); ++i) {
    if (out.tensors[i].begin < out.tensors[i - 1].end) {
      bad(fmt::format("tensors {} and {} overlap", printable(out.tensors[i - 1].name), printable(out.tensors[i].name)));
    }
  }
  return out;
}

std::string safetensorsDtypeName(at::ScalarType type) { return dtypeName(type, "?"); }

std::optional<at::ScalarType> safetensorsDtype(const std::string& name) {
  for (const auto& d : kDtypes) {
    if (name == d.name) return d.type;
  }
  return std::nullopt;
}

void readFileRange(const std::string& path, void* data, size_t bytes, uint64_t offset) {
  Fd in{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (in.fd < 0) fail<UsageError>("{}: cannot open: {}", path, errnoText(errno));
  if (!readAt(in.fd, data, bytes, offset, path)) {
    fail<UsageError>("{}: the file ends before byte {} (it was truncated)", path, offset + bytes);
  }
}

WeightsFile readSafetensors(const std::string& path) {
  // Everything checked before anything is read.
  SafetensorsHeader header = readSafetensorsHeader(path);
  Fd in{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (in.fd < 0) fail<UsageError>("{}: cannot open: {}", path, errnoText(errno));
  WeightsFile out;
  out.metadata = std::move(header.metadata);
  for (SafetensorsEntry& entry : header.tensors) {
    at::Tensor t = at::empty(entry.sizes, at::TensorOptions().dtype(entry.type));
    if (entry.end > entry.begin &&
        !readAt(in.fd, t.data_ptr(), static_cast<size_t>(entry.end - entry.begin), entry.begin, path)) {
      fail<UsageError>("{}: not a valid safetensors file: the file ends inside tensor {}", path, printable(entry.name));
    }
    out.tensors.emplace_back(std::move(entry.name), std::move(t));
  }
  return out;
}

}  // namespace ddp
