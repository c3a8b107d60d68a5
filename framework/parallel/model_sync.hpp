// Keeping a model the same on every rank: checking that every rank built
// the same one, and copying rank 0's tensors to the others. Used by DDP and
// the sharded strategies when they wrap a model.
//
// Contract
// - uniqueParameters / uniqueBuffers: the module's tensors (recursively,
//   named as named_parameters() names them) with a tensor that two
//   submodules share listed once, at its first name.
// - verifySameModel: collective. Every rank passes its module; when any
//   rank's parameters or buffers differ from rank 0's in name, shape, dtype,
//   requires_grad or order, every rank throws the same UsageError naming the
//   first difference, prefixed by `who` ("DDP: parameter 'fc.weight' has
//   shape [4, 3] on rank 0 but [4, 2] on rank 1"). One 8-byte allgather when
//   they agree.
// - broadcastFromRankZero: collective. Every rank ends with rank 0's values
//   in `tensors` (same list on every rank), packed as bytes whatever their
//   dtypes into flat chunks of at most 64 MiB per device (one collective
//   for a model's float and int64 buffers), sent as int32 words.
// - PackedBroadcast: the same, for a list broadcast again and again (DDP's
//   buffers after every step): the packing plan and memory are made once,
//   and contiguous CPU tensors are packed with memcpy. A run first checks
//   each tensor's size, dtype and device against the plan and plans again
//   when one changed (a model moved with to() after wrapping). run() is a
//   collective, as broadcastFromRankZero.
// - shardableParameters: the unique parameters that require grad, in
//   registration order, after checking what flat sharding needs (zero,
//   fsdp): one floating dtype for all, and no embedding with sparse
//   gradients. Otherwise a UsageError prefixed by `who`, with a HINT.
// - allgatherStrings: collective. Every rank's string, in rank order
//   (packed into int64 words, padded to the longest).
#pragma once

#include <torch/nn/module.h>

#include <string>
#include <utility>
#include <vector>

#include "framework/comm/process_group.hpp"

namespace ddp {

std::vector<std::pair<std::string, at::Tensor>> uniqueParameters(const torch::nn::Module& module);
std::vector<std::pair<std::string, at::Tensor>> uniqueBuffers(const torch::nn::Module& module);

void verifySameModel(ProcessGroup& group, const torch::nn::Module& module, const std::string& who,
                     Milliseconds timeout);

void broadcastFromRankZero(ProcessGroup& group, const std::vector<at::Tensor>& tensors, Milliseconds timeout);

class PackedBroadcast {
 public:
  explicit PackedBroadcast(const std::vector<at::Tensor>& tensors);
  void run(ProcessGroup& group, Milliseconds timeout);
  bool empty() const { return chunks_.empty(); }

 private:
  void plan();
  bool planStillFits() const;

  std::vector<at::Tensor> tensors_;
  struct Member {
    int64_t bytes;
    at::ScalarType dtype;
    at::Device device;
  };
  std::vector<Member> planned_;  // tensors_ as plan() saw them
  struct Chunk {
    std::vector<at::Tensor> members;
    std::vector<int64_t> offsets;  // bytes into flat
    int64_t bytes = 0;
    at::Tensor flat, words;  // allocated by the first run()
  };
  std::vector<Chunk> chunks_;
};

std::vector<std::pair<std::string, at::Tensor>> shardableParameters(const torch::nn::Module& module,
                                                                    const char* who);

std::vector<std::string> allgatherStrings(ProcessGroup& group, const std::string& mine, Milliseconds timeout);

}  // namespace ddp
