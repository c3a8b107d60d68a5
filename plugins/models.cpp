// Models: registration of the built-in ones (the implementations live in
// plugins/models/).
#include "plugins/common.hpp"
#include "plugins/models/mlp.hpp"

namespace ddp::plugins {

void registerModels(PluginRegistry& registry) {
  registry.add({"mlp",
                "multi-layer perceptron: Linear layers with an activation between them",
                {
                    Param("layers", ParamType::IntList, std::vector<int64_t>{13, 64, 3},
                          "widths: input, hidden..., output; a first or last 0 takes it from the dataset")
                        .atLeast(0),
                    Param("activation", ParamType::String, "relu", "between the layers")
                        .oneOf({"relu", "tanh", "gelu", "sigmoid"}),
                    Param("dropout", ParamType::Float, 0.0, "drop probability after each hidden activation, < 1")
                        .atLeast(0)
                        .atMost(1),
                },
                makeMlp});
}

}  // namespace ddp::plugins
