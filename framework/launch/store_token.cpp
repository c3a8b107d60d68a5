#include "framework/launch/store_token.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>

#include "framework/core/errors.hpp"
#include "framework/core/log.hpp"
#include "framework/core/system.hpp"
#include "framework/store/tcp_store.hpp"  // kStoreTokenEnv

namespace ddp {

std::string storeTokenFromEnvironment() {
  if (const char* token = std::getenv(kStoreTokenEnv); token != nullptr && *token != '\0') return token;
  const char* path = std::getenv(kStoreTokenFileEnv);
  if (path == nullptr || *path == '\0') return "";
  struct stat info {};
  if (::stat(path, &info) != 0) {
    const int err = errno;
    fail<UsageError>("{}={}: cannot read the store token file: {}. HINT: create it once on a file system every node "
                     "shares: (umask 077; head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n' > {})",
                     kStoreTokenFileEnv, path, errnoText(err), path);
  }
  if ((info.st_mode & 077) != 0) {
    fail<UsageError>("{}={}: the store token file can be read by others (mode {:o}). HINT: chmod 600 {}",
                     kStoreTokenFileEnv, path, info.st_mode & 0777, path);
  }
  std::ifstream in(path);
  std::string token;
  std::getline(in, token);
  if (!in && token.empty()) {
    fail<UsageError>("{}={}: cannot read the store token file", kStoreTokenFileEnv, path);
  }
  while (!token.empty() && (token.back() == '\r' || token.back() == ' ')) token.pop_back();
  if (token.empty()) fail<UsageError>("{}={}: the store token file is empty", kStoreTokenFileEnv, path);
  return token;
}

void warnWithoutToken(const RankEnv& env, const std::string& token) {
  const bool spansHosts = env.worldSize > env.localWorldSize;
  if (!token.empty() || !spansHosts || env.rank != 0) return;
  logWarn("WARNING: this job spans several nodes and its store at {}:{} has no token: any process that reaches the "
          "port can read and write the job's keys. HINT: export the same {} on every node (ddp.sbatch does), or set "
          "{} to a file with a secret (mode 0600) on a file system all nodes share; see docs/clusters.md#the-store-and-its-token",
          env.masterAddr, env.masterPort, kStoreTokenEnv, kStoreTokenFileEnv);
}

}  // namespace ddp
