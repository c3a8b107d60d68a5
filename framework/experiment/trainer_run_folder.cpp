// The Trainer's run folder (trainer.hpp): creating or checking it for resume, and reading
// the checkpoint a run resumes from.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/serialize.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <vector>

#include "framework/checkpoint/sharded_checkpoint.hpp"
#include "framework/core/append_file.hpp"
#include "framework/core/errors.hpp"
#include "framework/core/system.hpp"
#include "framework/experiment/resume_rules.hpp"
#include "framework/experiment/run_folder.hpp"
#include "framework/experiment/trainer_impl.hpp"

namespace ddp {
namespace {

// Renames metrics.jsonl, metrics.csv and steps.jsonl of `runDir` to
// NAME.before-restart-K.EXT with the first K that none of them has; returns
// the new names, for the log.
std::string keepRecordsAside(const std::string& runDir) {
  std::error_code ec;
  const std::filesystem::path dir(runDir);
  const std::filesystem::path records[] = {"metrics.jsonl", "metrics.csv", "steps.jsonl"};
  const auto kept = [&](const std::filesystem::path& name, int k) {
    return dir / fmt::format("{}.before-restart-{}{}", name.stem().string(), k, name.extension().string());
  };
  int k = 1;
  while (std::any_of(std::begin(records), std::end(records),
                     [&](const auto& name) { return std::filesystem::exists(kept(name, k), ec); })) {
    ++k;
  }
  std::vector<std::string> moved;
  for (const auto& name : records) {
    if (!std::filesystem::exists(dir / name, ec)) continue;
    std::filesystem::rename(dir / name, kept(name, k), ec);
    if (ec) {
      fail<std::runtime_error>("restart: cannot keep {} as {}: {}", (dir / name).string(), kept(name, k).string(),
                               ec.message());
    }
    moved.push_back(kept(name, k).filename().string());
  }
  return fmt::format("{} in {}", fmt::join(moved, ", "), runDir);
}

void makeRunFolder(const std::string& runDir) {
  std::error_code ec;
  std::filesystem::create_directories(runDir, ec);
  if (ec) fail<UsageError>("cannot create run folder {}: {}", runDir, ec.message());
}

}  // namespace

void checkRunFolderIsFree(const std::string& runDir) {
  std::error_code ec;
  const bool hasMetrics = std::filesystem::exists(runDir + "/metrics.jsonl", ec);
  const bool hasCheckpoints = !std::filesystem::is_empty(runDir + "/checkpoints", ec) && !ec;
  if (hasMetrics || hasCheckpoints) {
    fail<UsageError>("run folder {} already holds a run ({}). HINT: --resume to continue it, or another --out", runDir,
                     hasCheckpoints ? "checkpoints/" : "metrics.jsonl");
  }
}

namespace trainer_detail {

// A sharded checkpoint's step, position and RNG, after checking that every
// file is whole and of this save, and that it holds this model's tensors
// in their shapes (so that a bad checkpoint is passed over for an older
// one here, before anything is loaded).
CheckpointState loadShardedCheckpointMeta(const std::string& path, torch::nn::Module& model) {
  CheckpointState state;
  state.sharded = true;
  try {
    ShardedCheckpoint checkpoint(path);
    checkpoint.verify();
    const auto check = [&](const std::string& name, const at::Tensor& t) {
      if (!checkpoint.has("model/" + name)) {
        fail<std::runtime_error>("it has no model/{} (a checkpoint of another model?)", name);
      }
      if (checkpoint.shape("model/" + name) != t.sizes().vec()) {
        fail<std::runtime_error>("model/{} is [{}] there, [{}] in this model", name,
                                 fmt::join(checkpoint.shape("model/" + name), ","), fmt::join(t.sizes(), ","));
      }
    };
    for (const auto& item : model.named_parameters()) check(item.key(), item.value());
    for (const auto& item : model.named_buffers()) check(item.key(), item.value());
    const nlohmann::json& meta = checkpoint.meta();
    state.epoch = meta.at("epoch").get<int64_t>();
    state.steps = meta.at("steps").get<int64_t>();
    state.batch = meta.value("batch", int64_t(0));
    state.consumed = meta.value("consumed", int64_t(0));
    state.worldSize = meta.value("world_size", int64_t(0));
    // Checkpoints from before "elastic" was recorded held `consumed` only
    // when an elastic run wrote them.
    state.elastic = meta.contains("elastic") ? meta["elastic"].get<bool>() : state.consumed > 0;
    state.partial = meta.value("partial", std::vector<double>{});
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    generator.set_state(checkpoint.readWhole("trainer/rng").contiguous());
  } catch (const std::exception& e) {
    std::string why = e.what();
    why = why.substr(0, why.find('\n'));
    fail<std::runtime_error>("checkpoint {} cannot be read ({})", path, why);
  }
  return state;
}

// Every rank, before the strategy exists: model and optimizer state, RNG
// and step count. The optimizer's hyper-parameters stay those of the
// experiment (resume_rules.hpp lets them change). Any failure is one
// runtime_error naming the file.
CheckpointState loadCheckpoint(const std::string& path, torch::nn::Module& model,
                               torch::optim::Optimizer& optimizer) {
  CheckpointState state;
  if (isShardedCheckpoint(path)) return loadShardedCheckpointMeta(path, model);
  try {
    std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> options;
    for (auto& g : optimizer.param_groups()) options.push_back(g.options().clone());
    torch::serialize::InputArchive archive;
    archive.load_from(path);
    loadModelAndOptimizer(archive, model, optimizer);
    at::Tensor epoch, steps, rng, batch, partial, consumed, world, elastic;
    archive.read("epoch", epoch);
    archive.read("steps", steps);
    archive.read("rng", rng);
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    generator.set_state(rng);
    state.epoch = epoch.item<int64_t>();
    state.steps = steps.item<int64_t>();
    if (archive.try_read("batch", batch)) state.batch = batch.item<int64_t>();
    if (archive.try_read("consumed", consumed)) state.consumed = consumed.item<int64_t>();
    if (archive.try_read("world_size", world)) state.worldSize = world.item<int64_t>();
    // Checkpoints from before "elastic" was recorded held `consumed` only
    // when an elastic run wrote them.
    state.elastic = archive.try_read("elastic", elastic) ? elastic.item<int64_t>() != 0 : state.consumed > 0;
    if (archive.try_read("partial", partial)) {
      partial = partial.to(at::kDouble).contiguous();
      state.partial.assign(partial.data_ptr<double>(), partial.data_ptr<double>() + partial.numel());
    }
    auto& groups = optimizer.param_groups();
    for (size_t g = 0; g < groups.size() && g < options.size(); ++g) groups[g].set_options(std::move(options[g]));
  } catch (const std::exception& e) {
    std::string why = e.what();
    why = why.substr(0, why.find('\n'));
    fail<std::runtime_error>("checkpoint {} cannot be read ({})", path, why);
  }
  return state;
}

// Rank 0, once the plugins are built and before anything is written: makes
// or (on resume) checks the run folder, and returns the checkpoint to resume
// from ("" for none), loaded into model and optimizer. Nothing in the
// folder changes before every check has passed; config.json is written last.
std::string prepareRunFolder(const ExperimentConfig& config, const RunOptions& options, torch::nn::Module& model,
                             torch::optim::Optimizer& optimizer, std::vector<std::string>* notes,
                             CheckpointState* state, std::unique_ptr<RunFolderLock>* lock,
                             const std::map<std::string, std::string>& runFiles) {
  const std::string& runDir = options.runDir;
  const std::string configPath = runDir + "/config.json";
  std::error_code ec;
  std::string chosen;
  // A restart by a launcher or scheduler before the folder held a run starts it.
  if (options.resume && (!options.restart || std::filesystem::exists(configPath, ec))) {
    if (!std::filesystem::is_directory(runDir, ec)) {
      if (std::filesystem::exists(runDir, ec)) {
        fail<UsageError>("--resume: {} is a file, not a run folder. HINT: --out the folder of the run to continue",
                         runDir);
      }
      fail<UsageError>("--resume: run folder {} does not exist. HINT: --out the folder of the run to continue", runDir);
    }
    *lock = std::make_unique<RunFolderLock>(runDir);
    std::ifstream in(configPath);
    if (!in) {
      fail<UsageError>(
          "--resume: {} holds no config.json, so no run to continue. HINT: --out the folder of the run to continue",
          runDir);
    }
    Json saved = Json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (saved.is_discarded()) {
      fail<UsageError>("--resume: {} is not valid JSON. HINT: restore it, or start a new run with another --out",
                       configPath);
    }
    if (!config.resolved.is_null()) {
      for (const ConfigChange& change : checkResumeChanges(runDir, saved, config.resolved)) {
        notes->push_back(fmt::format("resume: {} {} -> {}", change.key, change.before, change.after));
      }
    }
    // The newest checkpoint that loads; every other rank loads the same file.
    std::vector<std::string> unreadable;
    const std::vector<CheckpointFile> checkpoints = listCheckpoints(runDir);
    for (const CheckpointFile& file : checkpoints) {
      try {
        *state = loadCheckpoint(file.path, model, optimizer);
        chosen = file.path;
        break;
      } catch (const std::runtime_error& e) {
        unreadable.push_back(e.what());
      }
    }
    if (!checkpoints.empty() && chosen.empty()) {
      fail<UsageError>("--resume: no checkpoint in {}/checkpoints can be read; the newest: {}", runDir,
                               unreadable.front());
    }
    for (const std::string& why : unreadable) notes->push_back(fmt::format("{}; resuming from {}", why, chosen));
    const auto metricsBytes = std::filesystem::file_size(runDir + "/metrics.jsonl", ec);
    if (chosen.empty() && !options.restart && !ec && metricsBytes > 0) {
      fail<UsageError>(
          "--resume: {} holds metrics but no checkpoint to continue from; starting again would overwrite them. HINT: "
          "runs to be resumed need training.save_every > 0; start this one again with another --out",
          runDir);
    }
    std::error_code stepsEc;
    const auto stepsBytes = std::filesystem::file_size(runDir + "/steps.jsonl", stepsEc);
    const bool hasSteps = !stepsEc && stepsBytes > 0;
    if (chosen.empty() && ((options.restart && !ec && metricsBytes > 0) || hasSteps)) {
      // A restart, or a --resume of a run stopped inside its first epoch,
      // with nothing to resume from starts over; the records of the attempt
      // before are kept beside the new ones, not overwritten or mixed in.
      const std::string kept = keepRecordsAside(runDir);
      notes->push_back(fmt::format(
          "{}: no checkpoint to continue from, so training starts over; the earlier records are kept as {}. "
          "HINT: training.save_every > 0 lets a {} continue instead",
          options.restart ? "restart" : "resume", kept, options.restart ? "restart" : "resume"));
    }
  } else {
    makeRunFolder(runDir);
    *lock = std::make_unique<RunFolderLock>(runDir);
  }
  checkWritable(runDir);
  if (config.training.saveEvery > 0 || config.training.checkpointOnSignal || config.training.keepBest > 0) {
    checkWritable(runDir + "/checkpoints");
  }
  // What the dataset leaves for later use of the run (a vocabulary).
  for (const auto& [name, contents] : runFiles) writeFileAtomically(runDir + "/" + name, contents);
  if (!config.resolved.is_null()) writeFileAtomically(configPath, config.resolved.dump(2) + "\n");
  return chosen;
}

}  // namespace trainer_detail
}  // namespace ddp
