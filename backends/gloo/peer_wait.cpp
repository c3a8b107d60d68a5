#include "backends/gloo/peer_wait.hpp"

#include <fmt/format.h>
#include <gloo/common/error.h>
#include <gloo/transport/unbound_buffer.h>

#include <chrono>
#include <stdexcept>
#include <string>

namespace ddp::gloo_backend {

void waitRecvFrom(::gloo::transport::UnboundBuffer& buffer, int peer, Deadline deadline, const std::string& what) {
  try {
    buffer.waitRecv(remaining(deadline));
  } catch (const ::gloo::IoException& e) {
    // Gloo's own timeout, in whole milliseconds from remaining(), ends up
    // to a millisecond before our deadline (seen once in 50 loops of the
    // collective tests): its message says so, and the clock nearly does.
    const bool timedOut = std::string(e.what()).find("Timed out") != std::string::npos ||
                          Clock::now() + std::chrono::milliseconds(50) >= deadline;
    if (timedOut) {
      throw std::runtime_error(fmt::format("rank {} did not arrive before the timeout ({})", peer, what));
    }
    throw std::runtime_error(fmt::format("the connection to rank {} failed ({}): {}", peer, what, e.what()));
  }
}

}  // namespace ddp::gloo_backend
