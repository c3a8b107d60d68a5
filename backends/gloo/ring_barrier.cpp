// The ring's barrier, for groups whose frames go around the ring (above
// FrameExchange::kAllToAllMaxRanks ranks): a token goes once around from
// rank 0, each rank passing it on only once it has entered, so when it
// comes back every rank has; a second lap lets every rank go.
#include <fmt/format.h>

#include <stdexcept>

#include "backends/gloo/ring.hpp"

namespace ddp::gloo_backend {

void Ring::barrier(Deadline deadline) {
  const int rank = links_->rank();
  static const uint8_t token[2] = {1, 2};
  uint8_t received[2] = {0, 0};
  std::vector<Incoming> incoming;
  std::deque<Outgoing> outgoing;
  if (rank == 0) {
    outgoing.push_back({&token[0], 1});
    incoming.push_back({&received[0], 1, nullptr, &token[1], "barrier"});  // lap 1 back: start lap 2
    incoming.push_back({&received[1], 1, nullptr, nullptr, "barrier"});    // lap 2 back: done
  } else {
    incoming.push_back({&received[0], 1, nullptr, &token[0], "barrier"});
    incoming.push_back({&received[1], 1, nullptr, &token[1], "barrier"});
  }
  stream(incoming, std::move(outgoing), nullptr, 0, 1, deadline);
  if (received[0] != token[0] || received[1] != token[1]) {
    // The ring's stream is out of step: some rank ran another collective.
    throw std::runtime_error(fmt::format("the ring's barrier received bytes {} and {} from rank {}, not 1 and 2",
                                         received[0], received[1], links_->left()));
  }
}

}  // namespace ddp::gloo_backend
