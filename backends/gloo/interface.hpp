// Which network interface ProcessGroupGloo's TCP transport binds to, and
// how that is reported.
//
// The transport binds to ProcessGroupOptions::interface, else to
// GLOO_SOCKET_IFNAME, else to the local address whose route reaches
// MASTER_ADDR (ProcessGroupOptions::masterAddr; 127.0.0.1 when empty): on a
// multi-homed node that is the interface the peers can reach.
#pragma once

#include <memory>
#include <string>

#include "framework/comm/process_group.hpp"

namespace gloo::transport {
class Device;
}

namespace ddp {

// The local IP address whose route reaches `host` (no packet is sent).
// Throws UsageError when `host` does not resolve or nothing routes to it.
std::string localAddressTowards(const std::string& host);

namespace gloo_backend {

// Opens the TCP device on the interface chosen as above; throws UsageError
// naming `rank` and the interface when that fails.
std::shared_ptr<::gloo::transport::Device> openTcpDevice(const ProcessGroupOptions& options, int rank);

// "listens on 10.0.0.2 (interface eth0, the one that routes to MASTER_ADDR
// ...)", from Gloo's description of its device, "tcp, pci=, iface=eth0,
// speed=-1, addr=[10.0.0.2]".
std::string describeListenAddress(const std::string& device, const std::string& masterAddr);

// The IP address in a Gloo TCP device's description ("addr=[10.0.0.2]"),
// where the ring's own connections listen too.
std::string listenIp(const std::string& device);

}  // namespace gloo_backend
}  // namespace ddp
