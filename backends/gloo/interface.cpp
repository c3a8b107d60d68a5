#include "backends/gloo/interface.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gloo/transport/tcp/device.h>

#include <cstdlib>

#include "framework/core/errors.hpp"

namespace ddp {

std::string localAddressTowards(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), "9", &hints, &found) != 0 || !found) {
    fail<UsageError>("gloo: cannot resolve master address '{}'. HINT: set MASTER_ADDR to a reachable host name or "
                     "IP address",
                     host);
  }
  std::string result;
  for (addrinfo* ai = found; ai && result.empty(); ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, SOCK_DGRAM, 0);
    if (fd < 0) continue;
    // connect() on a UDP socket sends nothing; it only picks the route.
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
      sockaddr_storage local{};
      socklen_t len = sizeof(local);
      if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
        char text[INET6_ADDRSTRLEN] = {0};
        const void* addr = local.ss_family == AF_INET
                               ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
                               : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
        if (inet_ntop(local.ss_family, addr, text, sizeof(text))) result = text;
      }
    }
    ::close(fd);
  }
  freeaddrinfo(found);
  if (result.empty()) {
    fail<UsageError>("gloo: no local interface has a route to master address '{}'. HINT: check MASTER_ADDR, or "
                     "set GLOO_SOCKET_IFNAME to the interface to use",
                     host);
  }
  return result;
}

namespace gloo_backend {

std::shared_ptr<::gloo::transport::Device> openTcpDevice(const ProcessGroupOptions& options, int rank) {
  ::gloo::transport::tcp::attr attr;
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  if (!options.interface.empty()) {
    attr.iface = options.interface;
  } else if (ifname && *ifname) {
    attr.iface = ifname;
  } else {
    attr.hostname = localAddressTowards(options.masterAddr.empty() ? "127.0.0.1" : options.masterAddr);
  }
  try {
    return ::gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    fail<UsageError>("[rank {}] gloo: cannot open a TCP device on {}: {}. HINT: set GLOO_SOCKET_IFNAME to an "
                     "existing interface (see `ip addr`)",
                     rank, attr.iface.empty() ? "address " + attr.hostname : "interface " + attr.iface, e.what());
  }
}

namespace {
// The text between `key` and `end` in a device description; "" without it.
std::string deviceField(const std::string& device, const std::string& key, const std::string& end) {
  const size_t at = device.find(key);
  if (at == std::string::npos) return std::string();
  const size_t from = at + key.size();
  return device.substr(from, device.find(end, from) - from);
}
}  // namespace

std::string listenIp(const std::string& device) {
  std::string addr = deviceField(device, "addr=[", "]");
  return addr.empty() ? device : addr;
}

std::string describeListenAddress(const std::string& device, const std::string& masterAddr) {
  std::string addr = deviceField(device, "addr=[", "]"), iface = deviceField(device, "iface=", ",");
  if (addr.empty()) addr = device;
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  const std::string why =
      ifname && *ifname ? "from GLOO_SOCKET_IFNAME" : "the one that routes to MASTER_ADDR " + masterAddr;
  return fmt::format("listens on {} (interface {}, {})", addr, iface.empty() ? "?" : iface, why);
}

}  // namespace gloo_backend
}  // namespace ddp
