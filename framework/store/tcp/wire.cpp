#include "framework/store/tcp/wire.hpp"

#include "framework/store/tcp/auth.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace ddp::tcpstore {

namespace {

constexpr char kMagic[8] = {'D', 'D', 'P', 'S', 'T', 'O', 'R', 'E'};

void putU32(std::string& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>((v >> shift) & 0xff));
}

uint64_t getBigEndian(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

// Reads fields from a payload; every read checks the bounds.
class Reader {
 public:
  explicit Reader(const std::string& data) : data_(data) {}

  bool u8(uint8_t* v) {
    if (left() < 1) return false;
    *v = static_cast<uint8_t>(data_[pos_++]);
    return true;
  }
  bool u32(uint32_t* v) {
    if (left() < 4) return false;
    *v = static_cast<uint32_t>(getBigEndian(data_.data() + pos_, 4));
    pos_ += 4;
    return true;
  }
  bool bytes(size_t n, std::string* out) {
    if (left() < n) return false;
    out->assign(data_, pos_, n);
    pos_ += n;
    return true;
  }
  size_t left() const { return data_.size() - pos_; }

 private:
  const std::string& data_;
  size_t pos_ = 0;
};

}  // namespace

const char* commandName(uint8_t command) {
  switch (command) {
    case kSet: return "set";
    case kGet: return "get";
    case kAdd: return "add";
    case kCheck: return "check";
    case kWait: return "wait";
  }
  return "?";
}

uint32_t frameLength(const char* header) { return static_cast<uint32_t>(getBigEndian(header, 4)); }

std::string frame(const std::string& payload) {
  std::string out;
  out.reserve(4 + payload.size());
  putU32(out, static_cast<uint32_t>(payload.size()));
  out += payload;
  return out;
}

std::string helloFrame(const std::string& clientNonce) {
  std::string hello(kMagic, sizeof kMagic);
  hello.push_back(static_cast<char>(kProtocolVersion));
  hello += clientNonce;
  return frame(hello);
}

std::string checkHello(const std::string& payload, std::string* clientNonce) {
  Reader r(payload);
  std::string magic;
  uint8_t version = 0;
  if (!r.bytes(sizeof kMagic, &magic) || magic != std::string(kMagic, sizeof kMagic) || !r.u8(&version)) {
    return "malformed handshake (not a ddp store client?)";
  }
  if (version != kProtocolVersion) {
    return fmt::format("store protocol version {}, expected {}", version, kProtocolVersion);
  }
  if (r.left() != kNonceBytes) return "malformed handshake (not a ddp store client?)";
  r.bytes(kNonceBytes, clientNonce);
  return "";
}

std::string encodeRequest(uint8_t command, const std::vector<std::string>& keys, const Bytes& value) {
  std::string payload(1, static_cast<char>(command));
  putU32(payload, static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) {
    putU32(payload, static_cast<uint32_t>(k.size()));
    payload += k;
  }
  putU32(payload, static_cast<uint32_t>(value.size()));
  payload.append(value.begin(), value.end());
  return payload;
}

bool decodeRequest(const std::string& payload, Request* out) {
  Reader r(payload);
  uint32_t keyCount = 0;
  out->keys.clear();
  // Each key takes at least its 4-byte length: a huge count cannot make us reserve memory.
  bool ok = r.u8(&out->command) && r.u32(&keyCount) && keyCount <= r.left() / 4;
  for (uint32_t i = 0; ok && i < keyCount; ++i) {
    uint32_t len = 0;
    out->keys.emplace_back();
    ok = r.u32(&len) && r.bytes(len, &out->keys.back());
  }
  uint32_t valueLen = 0;
  ok = ok && r.u32(&valueLen) && r.bytes(valueLen, &out->value) && r.left() == 0;
  const bool oneKey = out->keys.size() == 1;
  switch (out->command) {
    case kSet: return ok && oneKey;
    case kGet: return ok && oneKey && out->value.empty();
    case kAdd: return ok && oneKey && out->value.size() == 8;
    case kCheck:
    case kWait: return ok && out->value.empty();
  }
  return false;
}

Bytes encodeDelta(int64_t delta) {
  const auto v = static_cast<uint64_t>(delta);
  Bytes out;
  for (int shift = 56; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>((v >> shift) & 0xff));
  return out;
}

int64_t decodeDelta(const std::string& value) { return static_cast<int64_t>(getBigEndian(value.data(), 8)); }

std::string replyFrame(Status status, const std::string& body) {
  std::string payload(1, static_cast<char>(status));
  payload += body;
  return frame(payload);
}

bool decodeReply(const std::string& payload, Status* status, std::string* body) {
  if (payload.empty()) return false;
  *status = static_cast<Status>(static_cast<uint8_t>(payload[0]));
  body->assign(payload, 1, std::string::npos);
  return true;
}

}  // namespace ddp::tcpstore
