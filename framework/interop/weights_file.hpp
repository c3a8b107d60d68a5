// A model's weights in a file other tools read: safetensors or torch.save's
// format, chosen by name when writing and by content when reading.
//
// Contract
// - parseWeightsFormat("safetensors" | "torch"), else UsageError listing both.
// - writeWeightsFile: safetensors.hpp or torch_file.hpp; `metadata` goes into
//   a safetensors header's __metadata__ (the torch format holds tensors only).
// - writeWeightsFileStreamed: the same, from tensors produced one at a time
//   (named_tensors.hpp's TensorLayout and TensorSource): at most one tensor
//   in memory.
// - readWeightsFile: a file that starts as a zip archive is read as torch.save's
//   format, one with a plausible safetensors header as safetensors, whatever
//   its name; anything else, or a missing file, is one UsageError naming it.
// - moduleState(module): its parameters and buffers under their names
//   (PyTorch's state_dict names: python/ddp_models.py builds the same modules).
// - loadModuleState(module, file, where): copies every tensor into the
//   module's parameter or buffer of that name (converting its dtype, as
//   load_state_dict does), without recording autograd. Nothing is copied
//   unless everything fits: otherwise one UsageError that lists the missing,
//   unexpected and wrongly shaped names (a few of each, with counts) and,
//   where the file's names differ from the module's by a prefix (`module.`
//   of DistributedDataParallel, `_orig_mod.` of torch.compile, any other),
//   a HINT with that prefix and the fix.
#pragma once

#include <torch/nn/module.h>

#include <string>

#include "framework/interop/named_tensors.hpp"

namespace ddp {

enum class WeightsFormat { Safetensors, Torch };

WeightsFormat parseWeightsFormat(const std::string& name);
std::string weightsFormatName(WeightsFormat format);

void writeWeightsFile(const std::string& path, WeightsFormat format, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});
void writeWeightsFileStreamed(const std::string& path, WeightsFormat format, const std::vector<TensorLayout>& layout,
                              const TensorSource& tensor, const std::map<std::string, std::string>& metadata = {});
WeightsFile readWeightsFile(const std::string& path);

NamedTensors moduleState(const torch::nn::Module& module);
void loadModuleState(torch::nn::Module& module, const NamedTensors& tensors, const std::string& where);

}  // namespace ddp
