// TensorBoard event files (tensorboard_events.hpp).
#include "framework/interop/tensorboard_events.hpp"

#include <fcntl.h>
#include <limits.h>
#include <unistd.h>

#include <fmt/format.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <system_error>

#include "framework/core/errors.hpp"
#include "framework/core/system.hpp"

namespace ddp {
namespace {

std::string errnoMessage(int err) { return std::error_code(err, std::generic_category()).message(); }

// ---- CRC-32C ----

constexpr uint32_t kCastagnoliReflected = 0x82F63B78u;
constexpr uint32_t kMaskDelta = 0xa282ead8u;

constexpr std::array<uint32_t, 256> makeCrcTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc & 1u) != 0 ? (crc >> 1) ^ kCastagnoliReflected : crc >> 1;
    table[i] = crc;
  }
  return table;
}

constexpr std::array<uint32_t, 256> kCrcTable = makeCrcTable();

// ---- protobuf wire format ----

enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void putVarint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void putKey(std::string& out, uint32_t field, WireType type) { putVarint(out, (uint64_t{field} << 3) | type); }

void putLittleEndian(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

void putDouble(std::string& out, uint32_t field, double v) {
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof bits);
  putKey(out, field, kFixed64);
  putLittleEndian(out, bits, 8);
}

void putFloat(std::string& out, uint32_t field, float v) {
  uint32_t bits = 0;
  std::memcpy(&bits, &v, sizeof bits);
  putKey(out, field, kFixed32);
  putLittleEndian(out, bits, 4);
}

// int64 as protobuf writes it: two's complement, so a negative one takes 10 bytes.
void putInt64(std::string& out, uint32_t field, int64_t v) {
  putKey(out, field, kVarint);
  putVarint(out, static_cast<uint64_t>(v));
}

// A string, bytes or embedded message.
void putBytes(std::string& out, uint32_t field, const std::string& bytes) {
  putKey(out, field, kLengthDelimited);
  putVarint(out, bytes.size());
  out += bytes;
}

// The Event message's fields (tensorflow/core/util/event.proto).
constexpr uint32_t kEventWallTime = 1;
constexpr uint32_t kEventStep = 2;
constexpr uint32_t kEventFileVersion = 3;
constexpr uint32_t kEventSummary = 5;
// Summary and Summary.Value (tensorflow/core/framework/summary.proto).
constexpr uint32_t kSummaryValue = 1;
constexpr uint32_t kValueTag = 1;
constexpr uint32_t kValueSimpleValue = 2;
constexpr uint32_t kValueTensor = 8;
constexpr uint32_t kValueMetadata = 9;
constexpr uint32_t kMetadataPluginData = 1;
constexpr uint32_t kPluginDataPluginName = 1;
// TensorProto (tensor.proto) and DataType (types.proto).
constexpr uint32_t kTensorDtype = 1;
constexpr uint32_t kTensorShape = 2;
constexpr uint32_t kTensorStringVal = 8;
constexpr uint64_t kDtString = 7;

// Event{wall_time, step, summary} (step 0 omitted, as protobuf does).
std::string summaryEvent(double wallTime, int64_t step, const std::string& summary) {
  std::string event;
  putDouble(event, kEventWallTime, wallTime);
  if (step != 0) putInt64(event, kEventStep, step);
  putBytes(event, kEventSummary, summary);
  return event;
}

std::string scalarValue(const std::string& tag, double value) {
  std::string v;
  putBytes(v, kValueTag, tag);
  putFloat(v, kValueSimpleValue, static_cast<float>(value));
  return v;
}

// Whether `s` is well-formed UTF-8 (no overlong forms, no surrogates, nothing
// above U+10FFFF).
bool isUtf8(const std::string& s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t extra = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      extra = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      extra = 2;
      if (c == 0xE0) lo = 0xA0;  // overlong
      if (c == 0xED) hi = 0x9F;  // surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      extra = 3;
      if (c == 0xF0) lo = 0x90;  // overlong
      if (c == 0xF4) hi = 0x8F;  // above U+10FFFF
    } else {
      return false;
    }
    if (n - i <= extra) return false;
    for (size_t k = 1; k <= extra; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return false;
    }
    i += extra + 1;
  }
  return true;
}

// The tag with bytes outside printable ASCII as \xNN, for a message.
std::string printable(const std::string& s) {
  std::string out;
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c < 0x7F) {
      out.push_back(ch);
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  return out;
}

void checkTag(const std::string& tag) {
  if (!isUtf8(tag)) throw std::invalid_argument("TensorBoard tag is not valid UTF-8: \"" + printable(tag) + "\"");
}

std::string hostName() {
  char name[HOST_NAME_MAX + 1] = {};
  if (::gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  std::string host(name);
  for (char& c : host) {
    if (c == '/') c = '_';  // a name, not a path
  }
  return host;
}

double secondsNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::atomic<uint64_t> writersMade{0};

}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = kCrcTable[(crc ^ p[i]) & 0xFFu] ^ (crc >> 8);
  return ~crc;
}

uint32_t maskedCrc32c(const void* data, size_t n) {
  const uint32_t crc = crc32c(data, n);
  return ((crc >> 15) | (crc << 17)) + kMaskDelta;
}

TensorBoardEventWriter::TensorBoardEventWriter(const std::string& dir) {
  const double now = secondsNow();
  const std::string stem = fmt::format("{}/events.out.tfevents.{}.{}.{}.", dir, static_cast<int64_t>(now),
                                       hostName(), static_cast<long>(::getpid()));
  // The counter makes the name unique within this process; another process
  // with the same name (a pid reused within the second on a shared folder)
  // makes O_EXCL fail, and the next number is tried.
  for (int attempt = 0;; ++attempt) {
    path_ = stem + std::to_string(writersMade.fetch_add(1));
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd_ >= 0) break;
    const int err = errno;
    if (err == EINTR || (err == EEXIST && attempt < 100)) continue;
    fail<std::runtime_error>("cannot create {}: {}", path_, errnoMessage(err));
  }
  std::string event;
  putDouble(event, kEventWallTime, now);
  putBytes(event, kEventFileVersion, "brain.Event:2");
  try {
    appendRecord(event);
    flush();
  } catch (...) {
    if (fd_ >= 0) ::close(fd_);
    ::unlink(path_.c_str());
    throw;
  }
}

TensorBoardEventWriter::~TensorBoardEventWriter() {
  try {
    flush();
  } catch (...) {
    // Nothing to tell from a destructor: the failed call before said it.
  }
  if (fd_ >= 0) ::close(fd_);
}

void TensorBoardEventWriter::addScalar(const std::string& tag, double value, int64_t step, double wallTime) {
  checkTag(tag);
  std::string summary;
  putBytes(summary, kSummaryValue, scalarValue(tag, value));
  appendRecord(summaryEvent(wallTime, step, summary));
  flush();
}

void TensorBoardEventWriter::addScalars(const std::vector<std::pair<std::string, double>>& values, int64_t step,
                                        double wallTime) {
  if (values.empty()) return;
  for (const auto& [tag, value] : values) checkTag(tag);
  std::string summary;
  for (const auto& [tag, value] : values) putBytes(summary, kSummaryValue, scalarValue(tag, value));
  appendRecord(summaryEvent(wallTime, step, summary));
  flush();
}

void TensorBoardEventWriter::addText(const std::string& tag, const std::string& text, int64_t step,
                                     double wallTime) {
  checkTag(tag);
  std::string pluginData;
  putBytes(pluginData, kPluginDataPluginName, "text");
  std::string metadata;
  putBytes(metadata, kMetadataPluginData, pluginData);
  std::string tensor;
  putKey(tensor, kTensorDtype, kVarint);
  putVarint(tensor, kDtString);
  putBytes(tensor, kTensorShape, "");  // no dims: a scalar
  putBytes(tensor, kTensorStringVal, text);
  std::string value;
  putBytes(value, kValueTag, tag);
  putBytes(value, kValueTensor, tensor);
  putBytes(value, kValueMetadata, metadata);
  std::string summary;
  putBytes(summary, kSummaryValue, value);
  appendRecord(summaryEvent(wallTime, step, summary));
  flush();
}

void TensorBoardEventWriter::appendRecord(const std::string& event) {
  std::string length;
  putLittleEndian(length, event.size(), 8);
  buffer_ += length;
  putLittleEndian(buffer_, maskedCrc32c(length.data(), length.size()), 4);
  buffer_ += event;
  putLittleEndian(buffer_, maskedCrc32c(event.data(), event.size()), 4);
}

void TensorBoardEventWriter::flush() {
  if (buffer_.empty()) return;
  if (fd_ < 0) {
    buffer_.clear();
    fail<std::runtime_error>("cannot write {}: closed after an earlier write error", path_);
  }
  const off_t before = ::lseek(fd_, 0, SEEK_CUR);
  const int err = writeFully(fd_, buffer_.data(), buffer_.size());
  buffer_.clear();
  if (err == 0) return;
  // No torn record: cut the file back to where the buffered ones began.
  if (before < 0 || ::ftruncate(fd_, before) != 0 || ::lseek(fd_, before, SEEK_SET) != before) {
    const std::string why = errnoMessage(errno);
    // A torn record would hide every later one from readers: write no more.
    ::close(fd_);
    fd_ = -1;
    fail<std::runtime_error>("cannot write {}: {} (and cannot remove the partial record: {})", path_,
                             errnoMessage(err), why);
  }
  fail<std::runtime_error>("cannot write {}: {}", path_, errnoMessage(err));
}

}  // namespace ddp
