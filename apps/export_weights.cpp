// `ddp-run --export` (export_weights.hpp).
#include "apps/export_weights.hpp"

#include <fmt/format.h>

#include <fstream>
#include <sstream>

#include "framework/core/errors.hpp"
#include "framework/experiment/trained_model.hpp"
#include "framework/interop/weights_file.hpp"

namespace ddp::apps {

std::string exportWeights(const ExportOptions& options, PluginRegistry& registry, std::ostream& out) {
  const WeightsFormat format = parseWeightsFormat(options.format);
  const TrainedModel trained = loadTrainedModel(options.runDir, registry, options.checkpoint);
  const std::string output =
      !options.output.empty() ? options.output
                              : options.runDir + (format == WeightsFormat::Safetensors ? "/model.safetensors" : "/model.pt");
  const NamedTensors state = moduleState(*trained.model);
  std::map<std::string, std::string> metadata;
  metadata["format"] = "pt";  // the safetensors convention for PyTorch tensors
  metadata["ddp.model"] = trained.config["model"].dump();
  std::ifstream context(options.runDir + "/model_context.json");
  std::stringstream contextText;
  contextText << context.rdbuf();
  metadata["ddp.model_context"] = contextText.str();
  metadata["ddp.checkpoint"] = trained.checkpoint;
  writeWeightsFile(output, format, state, metadata);
  int64_t elements = 0;
  for (const auto& [name, tensor] : state) elements += tensor.numel();
  out << fmt::format("exported {} tensors ({} values) of model {} from {} to {} ({})\n", state.size(), elements,
                     trained.config["model"].value("name", std::string("?")), trained.checkpoint, output,
                     weightsFormatName(format));
  return output;
}

}  // namespace ddp::apps
