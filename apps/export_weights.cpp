// `ddp-run --export` (export_weights.hpp).
#include "apps/export_weights.hpp"

#include <c10/util/accumulate.h>
#include <fmt/format.h>

#include <fstream>
#include <sstream>

#include "framework/checkpoint/sharded_checkpoint.hpp"
#include "framework/core/errors.hpp"
#include "framework/experiment/trained_model.hpp"
#include "framework/interop/weights_file.hpp"

namespace ddp::apps {

namespace {

std::map<std::string, std::string> exportMetadata(const ExportOptions& options, const Json& config,
                                                  const std::string& checkpoint) {
  std::map<std::string, std::string> metadata;
  metadata["format"] = "pt";  // the safetensors convention for PyTorch tensors
  metadata["ddp.model"] = config["model"].dump();
  std::ifstream context(options.runDir + "/model_context.json");
  std::stringstream contextText;
  contextText << context.rdbuf();
  metadata["ddp.model_context"] = contextText.str();
  metadata["ddp.checkpoint"] = checkpoint;
  return metadata;
}

std::string outputPath(const ExportOptions& options, WeightsFormat format) {
  if (!options.output.empty()) return options.output;
  return options.runDir + (format == WeightsFormat::Safetensors ? "/model.safetensors" : "/model.pt");
}

}  // namespace

std::string exportWeights(const ExportOptions& options, PluginRegistry& registry, std::ostream& out) {
  const WeightsFormat format = parseWeightsFormat(options.format);
  const std::string output = outputPath(options, format);
  size_t count = 0;
  int64_t elements = 0;
  std::string checkpointPath;
  const TrainedModelSource source = findTrainedModel(options.runDir, registry, options.checkpoint);
  if (isShardedCheckpoint(source.checkpoint)) {
    // Consolidated tensor by tensor, straight from the ranges the ranks
    // wrote: the model is never built, and no more than one tensor is in
    // memory at a time (the index gives every name, dtype and shape).
    ShardedCheckpoint checkpoint(source.checkpoint);
    checkpoint.verify();
    std::vector<TensorLayout> layout;
    for (const std::string& entry : checkpoint.entries("model/")) {
      if (!checkpoint.scalar(entry).empty()) continue;
      layout.push_back({entry.substr(6), checkpoint.dtype(entry), checkpoint.shape(entry)});
    }
    if (layout.empty()) fail<UsageError>("checkpoint {} holds no model tensors", source.checkpoint);
    writeWeightsFileStreamed(output, format, layout,
                             [&](size_t i) { return checkpoint.readWhole("model/" + layout[i].name); },
                             exportMetadata(options, source.config, source.checkpoint));
    count = layout.size();
    for (const TensorLayout& t : layout) elements += c10::multiply_integers(t.shape);
    checkpointPath = source.checkpoint;
  } else {
    const TrainedModel trained = loadTrainedModel(options.runDir, registry, options.checkpoint);
    const NamedTensors state = moduleState(*trained.model);
    writeWeightsFile(output, format, state, exportMetadata(options, trained.config, trained.checkpoint));
    count = state.size();
    for (const auto& [name, tensor] : state) elements += tensor.numel();
    checkpointPath = trained.checkpoint;
  }
  out << fmt::format("exported {} tensors ({} values) of model {} from {} to {} ({})\n", count, elements,
                     source.config["model"].value("name", std::string("?")), checkpointPath, output,
                     weightsFormatName(format));
  return output;
}

}  // namespace ddp::apps
