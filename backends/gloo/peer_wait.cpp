#include "backends/gloo/peer_wait.hpp"

#include <fmt/format.h>
#include <gloo/common/error.h>
#include <gloo/transport/unbound_buffer.h>

#include <stdexcept>

namespace ddp::gloo_backend {

void waitRecvFrom(::gloo::transport::UnboundBuffer& buffer, int peer, Deadline deadline, const std::string& what) {
  try {
    buffer.waitRecv(remaining(deadline));
  } catch (const ::gloo::IoException& e) {
    if (Clock::now() >= deadline) {
      throw std::runtime_error(fmt::format("rank {} did not arrive before the timeout ({})", peer, what));
    }
    throw std::runtime_error(fmt::format("the connection to rank {} failed ({}): {}", peer, what, e.what()));
  }
}

}  // namespace ddp::gloo_backend
