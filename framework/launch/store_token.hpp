// The job's store token, as a rank finds it.
//
// Contract
// - DDP_STORE_TOKEN when set; otherwise the first line of the file that
//   DDP_STORE_TOKEN_FILE names (a secret on a file system every node shares);
//   otherwise "" (no token: any client that reaches the port is served).
// - A token file that cannot be read, is empty, or can be read by group or
//   others (mode beyond 0600) fails with UsageError naming the file.
// - warnWithoutToken: the job spans hosts and has no token: rank 0 says so,
//   once, in one line with a HINT. One-host jobs started by ddp-run always
//   have a token (the launcher makes one).
#pragma once

#include <string>

#include "framework/launch/rank_env.hpp"

namespace ddp {

constexpr const char* kStoreTokenFileEnv = "DDP_STORE_TOKEN_FILE";

std::string storeTokenFromEnvironment();

void warnWithoutToken(const RankEnv& env, const std::string& token);

}  // namespace ddp
