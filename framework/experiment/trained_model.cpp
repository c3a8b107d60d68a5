#include "framework/experiment/trained_model.hpp"

#include <torch/serialize.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <map>
#include <sstream>

#include "framework/checkpoint/sharded_checkpoint.hpp"
#include "framework/core/errors.hpp"
#include "framework/core/system.hpp"
#include "framework/experiment/experiment_config.hpp"
#include "framework/experiment/run_folder.hpp"

namespace ddp {

namespace {

// `what`: what the file holds, for the error.
std::string readWhole(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    fail<UsageError>("{} cannot be read ({}), so no trained model there. HINT: the --out folder of a run that trained",
                     path, what);
  }
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

std::string modelContextJson(const ModelContext& context, Task task) {
  nlohmann::ordered_json doc;
  doc["task"] = taskName(task);
  doc["sample_shape"] = context.sampleShape;
  doc["num_features"] = context.numFeatures;
  doc["num_classes"] = context.numClasses;
  doc["vocab_size"] = context.vocabSize;
  return doc.dump(2) + "\n";
}

ModelContext modelContextFromJson(const std::string& json, const std::string& where) {
  const Json doc = Json::parse(json, nullptr, /*allow_exceptions=*/false);
  ModelContext context;
  try {
    if (!doc.is_object()) throw std::runtime_error("not a JSON object");
    context.sampleShape = doc.at("sample_shape").get<std::vector<int64_t>>();
    context.numFeatures = doc.at("num_features").get<int64_t>();
    context.numClasses = doc.at("num_classes").get<int64_t>();
    context.vocabSize = doc.at("vocab_size").get<int64_t>();
  } catch (const std::exception& e) {
    fail<UsageError>("{}: not a model context as training writes it ({})", where, e.what());
  }
  return context;
}

TrainedModelSource findTrainedModel(const std::string& runDir, PluginRegistry& registry, const std::string& which) {
  TrainedModelSource trained;
  const std::string configPath = runDir + "/config.json";
  trained.config = Json::parse(readWhole(configPath, "the run's experiment"), nullptr, /*allow_exceptions=*/false);
  if (!trained.config.is_object() || !trained.config.contains("model")) {
    fail<UsageError>("{}: no model section", configPath);
  }
  // Checked as an experiment file is (the file may have been edited since
  // training wrote it): a bad value is a line naming it, not a crash.
  trained.model = parsePluginSection(trained.config["model"], "model", PluginKind::Model, configPath, registry);
  const std::string contextPath = runDir + "/model_context.json";
  trained.context = modelContextFromJson(readWhole(contextPath, "the model's shapes"), contextPath);
  if (which == "best") {
    trained.checkpoint = bestCheckpoint(runDir);
    if (trained.checkpoint.empty()) {
      fail<UsageError>("{} holds no best checkpoint (checkpoints/best/index.json). HINT: train with training.keep_best "
                       "> 0, or load the latest checkpoint",
                       runDir);
    }
  } else if (which == "latest" || which.empty()) {
    trained.checkpoint = newestCheckpoint(runDir);
    if (trained.checkpoint.empty()) {
      fail<UsageError>("{} holds no checkpoint to load the model from. HINT: train with training.save_every > 0",
                       runDir);
    }
  } else {
    trained.checkpoint = which;
    if (::access(which.c_str(), R_OK) != 0) {
      fail<UsageError>("checkpoint {}: cannot read it ({}). HINT: \"best\", \"latest\" or the path of a checkpoint "
                       "(.pt file or .shards folder) of the run",
                       which, errnoText(errno));
    }
  }
  return trained;
}

TrainedModel loadTrainedModel(const std::string& runDir, PluginRegistry& registry, const std::string& which) {
  TrainedModelSource source = findTrainedModel(runDir, registry, which);
  const std::string configPath = runDir + "/config.json";
  const PluginChoice& choice = source.model;
  const std::string& name = choice.name;
  TrainedModel trained;
  trained.context = source.context;
  trained.checkpoint = source.checkpoint;
  trained.config = std::move(source.config);
  trained.model = registry.get(PluginKind::Model, name).model(choice.params, trained.context);
  // LibTorch's load() takes a saved tensor of any shape: compare them.
  const auto shapesOf = [](const torch::nn::Module& module) {
    std::map<std::string, std::vector<int64_t>> shapes;
    for (const auto& item : module.named_parameters()) shapes[item.key()] = item.value().sizes().vec();
    for (const auto& item : module.named_buffers()) shapes[item.key()] = item.value().sizes().vec();
    return shapes;
  };
  const auto built = shapesOf(*trained.model);
  if (isShardedCheckpoint(trained.checkpoint)) {
    // Tensor by tensor, each read from the ranges the ranks wrote: no more
    // memory than the model and its largest tensor.
    ShardedCheckpoint checkpoint(trained.checkpoint);
    at::NoGradGuard noGrad;
    const auto fill = [&](const std::string& key, at::Tensor t) {
      const std::string entry = "model/" + key;
      if (!checkpoint.has(entry)) {
        fail<UsageError>("checkpoint {} does not fit model {} of {}: it has no '{}'. HINT: the model section of {} "
                         "must be the one the run trained with",
                         trained.checkpoint, name, configPath, key, configPath);
      }
      if (checkpoint.shape(entry) != t.sizes().vec()) {
        fail<UsageError>("checkpoint {} does not fit model {} of {}: '{}' has shape [{}] in the checkpoint but [{}] "
                         "in the model. HINT: the model section of {} must be the one the run trained with",
                         trained.checkpoint, name, configPath, key, fmt::join(checkpoint.shape(entry), ", "),
                         fmt::join(t.sizes(), ", "), configPath);
      }
      t.copy_(checkpoint.readWhole(entry));
    };
    for (const auto& item : trained.model->named_parameters()) fill(item.key(), item.value());
    for (const auto& item : trained.model->named_buffers()) fill(item.key(), item.value());
    trained.model->eval();
    return trained;
  }
  try {
    torch::serialize::InputArchive archive, modelArchive;
    archive.load_from(trained.checkpoint);
    archive.read("model", modelArchive);
    trained.model->load(modelArchive);
  } catch (const c10::Error& e) {
    std::string why = e.what_without_backtrace();
    why = why.substr(0, why.find('\n'));
    fail<UsageError>("checkpoint {} does not fit model {} of {}: {}", trained.checkpoint, name, configPath, why);
  }
  const auto loaded = shapesOf(*trained.model);
  for (const auto& [key, shape] : built) {
    const std::vector<int64_t>& saved = loaded.at(key);
    if (saved != shape) {
      fail<UsageError>("checkpoint {} does not fit model {} of {}: '{}' has shape [{}] in the checkpoint but [{}] in "
                       "the model. HINT: the model section of {} must be the one the run trained with",
                       trained.checkpoint, name, configPath, key, fmt::join(saved, ", "), fmt::join(shape, ", "),
                       configPath);
    }
  }
  trained.model->eval();
  return trained;
}

}  // namespace ddp
