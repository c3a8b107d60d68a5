// The TCPStore wire protocol: how a handshake, a request and a reply are laid
// out as bytes. Both ends encode and decode through here; no sockets.
//
// Everything travels in frames: a 4-byte big-endian payload length, then the
// payload. Until a connection has passed its handshake the server accepts a
// frame of at most kMaxHandshakeFrame bytes (the handshake needs no more), so
// an unauthenticated peer cannot make it buffer more than that. After it,
// frames over kMaxFrame are refused: a key or value (a run folder's path, a
// backend's address list, a shared-memory segment name) is far smaller. Both
// limits are checked on the 4-byte length, before any payload is buffered.
// - Handshake: each side proves that it knows the job's token without
//   sending it (auth.hpp), the server first, so that a client never talks to
//   a server that does not know the token:
//     client -> server  "DDPSTORE" (8 bytes) | version (1 byte) | client nonce (16 bytes)
//     server -> client  kOk | server nonce (16 bytes) | server proof (32 bytes)
//     client -> server  client proof (32 bytes; empty when the server's proof was wrong)
//     server -> client  kOk (empty), or kRefused "wrong job token"
// - Request (client -> server, one at a time per connection):
//     command (1 byte) | key count (u32) | per key: length (u32), bytes |
//     value length (u32) | value bytes
//   SET: 1 key, the value.  GET: 1 key.  ADD: 1 key, an 8-byte big-endian
//   int64 delta.  CHECK, WAIT: any number of keys, no value.
// - Reply (server -> client): status (1 byte) | body
//   kOk: the handshake was accepted, or the result (GET: the value; ADD: the
//   new counter as decimal text; CHECK: one byte 0/1; SET, WAIT: empty).
//   kError: a message; the connection stays usable (e.g. ADD on a non-counter).
//   kRefused: the reason; the server closes the connection after it.
// Decoders check every length against the bytes at hand: the bytes may come
// from anyone who can reach the port.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "framework/store/store.hpp"

namespace ddp::tcpstore {

constexpr uint32_t kMaxFrame = 64u << 20;        // 64 MiB: a request after the handshake
constexpr uint32_t kMaxHandshakeFrame = 256;      // a handshake frame (25 or 32 bytes)
constexpr uint8_t kProtocolVersion = 2;

enum Command : uint8_t { kSet = 1, kGet = 2, kAdd = 3, kCheck = 4, kWait = 5 };
enum Status : uint8_t { kOk = 0, kError = 1, kRefused = 2 };

// "set", "get", ... for messages; "?" for anything else.
const char* commandName(uint8_t command);

// The payload length announced by a frame's 4-byte header.
uint32_t frameLength(const char* header);
// The frame carrying `payload`.
std::string frame(const std::string& payload);

// The client's first frame.
std::string helloFrame(const std::string& clientNonce);
// The server's verdict on a first frame: "" to go on (with *clientNonce
// set), else the reason to refuse.
std::string checkHello(const std::string& payload, std::string* clientNonce);

struct Request {
  uint8_t command = 0;
  std::vector<std::string> keys;
  std::string value;
};
// A request payload (not yet framed); it may exceed kMaxFrame.
std::string encodeRequest(uint8_t command, const std::vector<std::string>& keys, const Bytes& value);
// False when the payload is not a well-formed request for its command.
bool decodeRequest(const std::string& payload, Request* out);

// ADD's 8-byte delta.
Bytes encodeDelta(int64_t delta);
int64_t decodeDelta(const std::string& value);

std::string replyFrame(Status status, const std::string& body);
// Splits a reply payload; false when it is empty.
bool decodeReply(const std::string& payload, Status* status, std::string* body);

}  // namespace ddp::tcpstore
