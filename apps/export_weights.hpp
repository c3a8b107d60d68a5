// `ddp-run --export RUN_DIR`: a trained model's weights in a file PyTorch
// (and the tools that read safetensors) can load.
//
// Contract
// - The run's model is rebuilt from config.json and model_context.json and
//   loaded from the checkpoint `checkpoint` names ("latest", "best" or a
//   file: framework/experiment/trained_model.hpp), whatever strategy and
//   world size trained it. A sharded checkpoint is consolidated tensor by
//   tensor, read from the ranges the ranks wrote, without building the
//   model: peak memory is the largest tensor plus a fixed margin, not the
//   model (checked with `verify()` first: a missing or truncated shard is a
//   UsageError naming the file).
// - Its parameters and buffers, under the names of python/ddp_models.py's
//   modules, go to `output` (default RUN_DIR/model.safetensors or
//   RUN_DIR/model.pt) in `format`: safetensors, with the experiment's model
//   section, the model context and the checkpoint in __metadata__; or torch,
//   a file Python's torch.load reads as a dict (model.load_state_dict takes
//   it). The file is written atomically.
// - Prints one line: what was written. Bad options, a run without a
//   checkpoint: UsageError (one line, exit 2).
#pragma once

#include <ostream>
#include <string>

#include "framework/experiment/plugin_registry.hpp"

namespace ddp::apps {

struct ExportOptions {
  std::string runDir;
  std::string checkpoint = "latest";
  std::string format = "safetensors";  // or "torch"
  std::string output;                  // "": RUN_DIR/model.safetensors or RUN_DIR/model.pt
};

// The path written.
std::string exportWeights(const ExportOptions& options, PluginRegistry& registry, std::ostream& out);

}  // namespace ddp::apps
