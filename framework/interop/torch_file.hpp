// Weights files that Python's torch.save writes and torch.load reads: the
// zip archive (data.pkl plus one record per storage) of PyTorch >= 1.6.
//
// Contract
// - writeTorchStateDict: the tensors as one dict of name -> tensor (CPU,
//   contiguous), written with LibTorch's pickler to PATH.tmp and renamed.
//   Python reads it with torch.load(PATH) (weights_only too) as a plain
//   dict, which model.load_state_dict takes.
// - writeTorchStateDictStreamed: the same file from tensors produced one at
//   a time (`tensor(i)` must match layout[i], else std::runtime_error naming
//   it and no file): at most one tensor is held at a time. The pickle names
//   each storage only; it is made from stand-ins of each tensor's dtype and
//   size that are allocated and never touched (no resident memory).
// - readTorchStateDict: the state_dict in a file of torch.save(
//   model.state_dict(), PATH) (an OrderedDict, which LibTorch's own
//   unpickler cannot read: state_dict_unpickler.hpp), of a plain dict, or
//   of writeTorchStateDict. Every tensor is a CPU tensor that owns its
//   memory (views into a shared storage stay shared, so tied weights stay
//   tied). UsageError naming the file for anything else: not a zip archive
//   (a file of the legacy format, torch.save(..., _use_new_zipfile_
//   serialization=False), gets the Python line that converts it), a missing
//   or short storage record, a pickle that is not a state_dict.
#pragma once

#include <string>
#include <vector>

#include "framework/interop/named_tensors.hpp"

namespace ddp {

void writeTorchStateDict(const std::string& path, const NamedTensors& tensors);
void writeTorchStateDictStreamed(const std::string& path, const std::vector<TensorLayout>& layout,
                                 const TensorSource& tensor);

WeightsFile readTorchStateDict(const std::string& path);

// Whether the file starts as a zip archive does ("PK\x03\x04").
bool looksLikeZip(const std::string& path);

}  // namespace ddp
