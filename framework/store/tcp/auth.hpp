// Mutual authentication of TCPStore connections: SHA-256 and HMAC-SHA-256
// (FIPS 180-4, RFC 2104), and the two proofs of the handshake (wire.hpp).
//
// Contract
// - sha256 and hmacSha256 return the 32-byte digest as raw bytes; they match
//   the published test vectors (tests/test_store.cpp checks some).
// - Each side proves that it knows the job's token without sending it: the
//   proof is HMAC-SHA-256 keyed by the token over a role label and both
//   sides' random nonces, so a proof can be replayed neither on another
//   connection nor in the other direction.
// - Strength: that of HMAC-SHA-256 with the token as key. A passive
//   listener or a fake server sees only proofs; with ddp-run's tokens (128
//   random bits) guessing the token from them is out of reach, with a short
//   human-chosen DDP_STORE_TOKEN an offline dictionary attack is not. The
//   connection is not encrypted: keys and values travel in the clear, and
//   someone who can rewrite packets on the path can take over a connection
//   after its handshake. Use a private network for that threat.
#pragma once

#include <string>

namespace ddp::tcpstore {

std::string sha256(const std::string& data);
std::string hmacSha256(const std::string& key, const std::string& data);

constexpr size_t kNonceBytes = 16;
constexpr size_t kProofBytes = 32;

// A fresh random nonce (from the OS's random source).
std::string makeNonce();
// The server's and the client's proof for one connection.
std::string serverProof(const std::string& token, const std::string& clientNonce, const std::string& serverNonce);
std::string clientProof(const std::string& token, const std::string& clientNonce, const std::string& serverNonce);
// Compares in time independent of where a and b differ.
bool sameBytes(const std::string& a, const std::string& b);

}  // namespace ddp::tcpstore
