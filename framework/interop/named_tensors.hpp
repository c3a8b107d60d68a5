// Named tensors: a model's weights as they cross to and from other tools
// (PyTorch's state_dict, safetensors), in the order they were given.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace ddp {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// A weights file's contents: the tensors and, for safetensors, the header's
// __metadata__ (string to string).
// What a tensor will be, before it exists: for writers that take the
// tensors one at a time (safetensors.hpp, torch_file.hpp) and so hold at
// most one of them in memory.
struct TensorLayout {
  std::string name;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;
};
// Tensor i of the layout; it must have that dtype and shape.
using TensorSource = std::function<at::Tensor(size_t i)>;

struct WeightsFile {
  NamedTensors tensors;
  std::map<std::string, std::string> metadata;
};

}  // namespace ddp
