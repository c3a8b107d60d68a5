// CastHook: the fp16 and bf16 communication hooks. Each bucket is divided
// by the world size, cast to a 16-bit float type, summed across the ranks
// in that type, and cast back into the bucket: half the bytes on the wire
// for a rounding of each gradient to 16 bits (fp16: 11 significant bits,
// values below 6e-8 lost; bf16: 8 significant bits, float32's range).
// Dividing first keeps the sum of fp16 values within range.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <mutex>

#include "framework/parallel/comm_hook.hpp"

namespace ddp::plugins {

class CastHook : public CommHook {
 public:
  // wire: at::kHalf or at::kBFloat16; timeout > 0, for the collectives.
  CastHook(at::ScalarType wire, Milliseconds timeout);
  WorkPtr run(ProcessGroup& group, GradBucket& bucket) override;

 private:
  at::ScalarType wire_;
  Milliseconds timeout_;
  std::mutex mutex_;                        // buffers_: one hook may serve buckets on several threads
  std::map<size_t, at::Tensor> buffers_;  // the 16-bit copy of each bucket, reused every step
};

}  // namespace ddp::plugins
