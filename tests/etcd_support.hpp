// EtcdServer: an etcd of the test's own, on loopback ports the kernel
// picked, in a temporary data folder; gone (SIGKILL, reaped) with the
// object, and with the test process should it die first (PR_SET_PDEATHSIG).
//
// Tests that need one call EtcdServer::whyNot() first and print
// "SKIPPED: <reason>" when it is not empty (no etcd binary: Debian's
// etcd-server, which scripts/setup.sh installs).
#pragma once

#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <thread>

#include "framework/store/etcd/http.hpp"
#include "tests/test_support.hpp"

namespace ddp::test {

class EtcdServer {
 public:
  static constexpr const char* kBinary = "/usr/bin/etcd";

  static std::string whyNot() {
    if (::access(kBinary, X_OK) != 0) {
      return fmt::format("{} is not installed (Debian's etcd-server; scripts/setup.sh installs it)", kBinary);
    }
    return "";
  }

  EtcdServer() {
    // A port the kernel picked may be taken again before etcd binds it:
    // a start that fails is tried again on new ports.
    std::string why;
    for (int attempt = 0; attempt < 3; ++attempt) {
      if (start(&why)) return;
    }
    throw std::runtime_error("EtcdServer: etcd did not start: " + why);
  }

  ~EtcdServer() { stop(); }
  EtcdServer(const EtcdServer&) = delete;
  EtcdServer& operator=(const EtcdServer&) = delete;

  std::string endpoint() const { return fmt::format("127.0.0.1:{}", clientPort_); }
  int clientPort() const { return clientPort_; }
  pid_t pid() const { return pid_; }

  // SIGKILL, reaped.
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  static int freePort() {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    ::close(fd);
    return ntohs(a.sin_port);
  }

  bool start(std::string* why) {
    clientPort_ = freePort();
    const int peerPort = freePort();
    const std::string client = fmt::format("http://127.0.0.1:{}", clientPort_);
    const std::string peer = fmt::format("http://127.0.0.1:{}", peerPort);
    const std::string log = dir_.path() + "/etcd.log";
    const std::string data = dir_.path() + fmt::format("/data{}", clientPort_);
    const pid_t parent = ::getpid();
    std::fflush(stdout);  // or the child's freopen writes our buffered lines again
    std::fflush(stderr);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(1);
      std::freopen(log.c_str(), "a", stdout);
      std::freopen(log.c_str(), "a", stderr);
      const std::string cluster = "t=" + peer;
      ::execl(kBinary, kBinary, "--name", "t", "--data-dir", data.c_str(), "--listen-client-urls", client.c_str(),
              "--advertise-client-urls", client.c_str(), "--listen-peer-urls", peer.c_str(),
              "--initial-advertise-peer-urls", peer.c_str(), "--initial-cluster", cluster.c_str(),
              "--max-request-bytes", "16777216", "--log-level", "error", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    // Ready when a range answers.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        *why = "it exited at start (log: " + log + "): " + readFile(log).substr(0, 400);
        return false;
      }
      try {
        etcd::HttpConnection c("127.0.0.1", static_cast<uint16_t>(clientPort_),
                               std::chrono::steady_clock::now() + std::chrono::seconds(1));
        if (c.post("/v3/kv/range", R"({"key":"AA=="})", std::chrono::steady_clock::now() + std::chrono::seconds(2))
                .status == 200) {
          return true;
        }
      } catch (...) {
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    stop();
    *why = "it did not answer within 20 s (log: " + log + ")";
    return false;
  }

  TempDir dir_;
  int clientPort_ = 0;
  pid_t pid_ = -1;
};

}  // namespace ddp::test
