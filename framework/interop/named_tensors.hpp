// Named tensors: a model's weights as they cross to and from other tools
// (PyTorch's state_dict, safetensors), in the order they were given.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace ddp {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// A weights file's contents: the tensors and, for safetensors, the header's
// __metadata__ (string to string).
struct WeightsFile {
  NamedTensors tensors;
  std::map<std::string, std::string> metadata;
};

}  // namespace ddp
