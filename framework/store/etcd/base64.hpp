// Base64 (RFC 4648, with padding): how etcd's JSON gateway carries keys and
// values, which are bytes.
//
// Contract
// - decode(encode(b)) == b for any bytes.
// - decode accepts exactly what encode writes (padding included, no
//   whitespace) and throws std::invalid_argument otherwise.
#pragma once

#include <string>

namespace ddp::etcd {

std::string base64Encode(const std::string& bytes);
std::string base64Decode(const std::string& text);

}  // namespace ddp::etcd
