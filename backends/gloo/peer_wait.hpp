// waitRecvFrom: a receive on Gloo's TCP transport that says whom it waited
// for. Gloo's own timeout says only "Timed out waiting N ms for recv
// operation to complete"; the error of a collective whose peer never came
// should name that peer, as the shared-memory path does.
#pragma once

#include <string>

#include "backends/gloo/host_tensors.hpp"

namespace gloo::transport {
class UnboundBuffer;
}

namespace ddp::gloo_backend {

// buffer.waitRecv() until `deadline`. A timeout throws std::runtime_error
// "rank P did not arrive before the timeout (WHAT)"; a failed connection
// "the connection to rank P failed (WHAT): <Gloo's reason>".
void waitRecvFrom(::gloo::transport::UnboundBuffer& buffer, int peer, Deadline deadline, const std::string& what);

}  // namespace ddp::gloo_backend
