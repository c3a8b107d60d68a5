// Gloo message slots of ProcessGroupGloo's own messages. A slot tells apart
// the messages of concurrent phases; ours keep the top byte zero, Gloo's own
// collectives put an algorithm prefix there.
#pragma once

#include <cstdint>

namespace ddp::gloo_backend {

enum Phase : uint64_t { kFramePhase = 1 };

inline uint64_t slotFor(uint64_t seq, Phase phase) { return (seq << 8) | phase; }

}  // namespace ddp::gloo_backend
