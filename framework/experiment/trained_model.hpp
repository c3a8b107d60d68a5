// A trained model, loaded back from its run folder: what `ddp-run --sample`
// (and any program that uses a finished run) needs.
//
// Contract
// - Every run folder holds model_context.json, written by rank 0 with
//   config.json: the ModelContext the model was built with (sample shape,
//   classes, vocabulary size, task), so the model can be rebuilt without
//   its dataset (a corpus that has moved, a dataset too big to load for a
//   prediction).
// - loadTrainedModel(runDir, registry) builds config.json's model with that
//   context through the registry (an out-of-tree model needs its library
//   loaded first), loads the newest checkpoint's weights (or the best one's,
//   or a named file's), and returns it in
//   eval mode, on the CPU. UsageError, one line with a HINT, for a folder
//   without config.json, model_context.json or a checkpoint (a run with
//   training.save_every 0), or a checkpoint that does not fit the model.
#pragma once

#include <string>

#include "framework/experiment/experiment_config.hpp"
#include "framework/experiment/plugin_registry.hpp"

namespace ddp {

// model_context.json's contents, and back (`where` names the file in errors).
std::string modelContextJson(const ModelContext& context, Task task);
ModelContext modelContextFromJson(const std::string& json, const std::string& where);

struct TrainedModel {
  ModelPtr model;
  ModelContext context;
  std::string checkpoint;  // the file the weights came from
  Json config;             // config.json
};

// The run's model section, context and checkpoint, resolved and checked as
// loadTrainedModel does, without building the model (ddp-run --export of
// a sharded checkpoint streams it tensor by tensor instead).
struct TrainedModelSource {
  PluginChoice model;
  ModelContext context;
  std::string checkpoint;
  Json config;
};
TrainedModelSource findTrainedModel(const std::string& runDir, PluginRegistry& registry,
                                    const std::string& which = "latest");

// which: "latest" (the newest checkpoint), "best" (training.keep_best's
// best, run_folder.hpp's bestCheckpoint), or a checkpoint file's path.
TrainedModel loadTrainedModel(const std::string& runDir, PluginRegistry& registry,
                              const std::string& which = "latest");

}  // namespace ddp
