// Models: registration of the built-in ones (the implementations live in
// plugins/models/).
#include "plugins/common.hpp"
#include "plugins/models/cnn.hpp"
#include "plugins/models/gpt.hpp"
#include "plugins/models/mlp.hpp"

namespace ddp::plugins {

void registerModels(PluginRegistry& registry) {
  registry.add({"mlp",
                "multi-layer perceptron: Linear layers with an activation between them",
                {
                    Param("layers", ParamType::IntList, std::vector<int64_t>{0, 64, 0},
                          "widths: input, hidden..., output; a first or last 0 takes it from the dataset")
                        .atLeast(0),
                    Param("activation", ParamType::String, "relu", "between the layers")
                        .oneOf({"relu", "tanh", "gelu", "sigmoid"}),
                    Param("dropout", ParamType::Float, 0.0, "drop probability after each hidden activation")
                        .atLeast(0)
                        .below(1),
                },
                makeMlp});
  registry.add({"cnn",
                "convolutional network: conv -> batch norm -> activation -> pool blocks, a linear head (images)",
                {
                    Param("channels", ParamType::IntList, std::vector<int64_t>{16, 32},
                          "output channels of each conv block, one block per entry")
                        .atLeast(1),
                    Param("kernel_size", ParamType::Int, 3, "odd conv kernel size; \"same\" padding keeps H and W")
                        .atLeast(1),
                    Param("batch_norm", ParamType::Bool, true, "BatchNorm2d after each conv (the conv then has no bias)"),
                    Param("activation", ParamType::String, "relu", "after each conv block and the hidden layer")
                        .oneOf({"relu", "gelu", "tanh"}),
                    Param("pool", ParamType::String, "max", "2x2 pooling after each block, skipped at 1x1")
                        .oneOf({"max", "avg", "none"}),
                    Param("dropout", ParamType::Float, 0.0, "drop probability before the head")
                        .atLeast(0)
                        .below(1),
                    Param("hidden", ParamType::Int, 0, "0: the head is one Linear; > 0: Linear -> activation -> Linear")
                        .atLeast(0),
                },
                makeCnn});
  registry.add({"gpt",
                "decoder-only transformer language model (GPT-2 layout, pre-norm, causal self-attention)",
                {
                    Param("n_layer", ParamType::Int, 4, "transformer blocks").atLeast(1),
                    Param("n_head", ParamType::Int, 4, "attention heads; must divide n_embd").atLeast(1),
                    Param("n_embd", ParamType::Int, 128, "embedding width").atLeast(1),
                    Param("block_size", ParamType::Int, 0, "longest input in tokens; 0: the dataset's window length")
                        .atLeast(0),
                    Param("dropout", ParamType::Float, 0.1, "drop probability (embeddings, attention, residuals)")
                        .atLeast(0)
                        .below(1),
                    Param("bias", ParamType::Bool, true, "biases in the Linear layers and LayerNorms"),
                    Param("tie_weights", ParamType::Bool, true, "the lm head reuses the token embedding's weight"),
                },
                makeGpt});
}

}  // namespace ddp::plugins
