#include "framework/experiment/resume_rules.hpp"

#include <fmt/format.h>

#include <map>
#include <set>

#include "framework/core/errors.hpp"

namespace ddp {
namespace {

struct Rule {
  const char* prefix;  // a key, or a section ("optimizer") covering its keys
  bool allowed;
  const char* reason;
};

// The one place that says what may change on resume. The longest matching
// prefix wins; a key that matches none is refused (kUnlisted).
const Rule kRules[] = {
    {"name", true, "a label"},
    {"description", true, "a comment"},
    {"$schema", true, "a hint for editors"},
    {"plugins", true, "where plugins are loaded from; the plugins used are compared by name"},
    {"dataset", false, "the checkpoint was trained on the old data and split"},
    {"model.init_from", true, "only a run's first start reads it; a resume continues from the checkpoint"},
    {"model", false, "the checkpoint holds the old model's weights"},
    {"loss", false, "the checkpoint was trained for the old loss"},
    {"optimizer.name", false, "the checkpoint holds the old optimizer's state"},
    {"optimizer", true, "applies from the next step"},
    {"scheduler", true, "applies from the next epoch"},
    {"training.epochs", true, "the run continues to the new count"},
    {"training.max_steps", true, "the run stops at the new count"},
    {"training.save_every", true, "applies from the next epoch"},
    {"training.eval_every", true, "applies from the next epoch"},
    {"training.eval_batch_size", true, "changes only how evaluation is batched"},
    {"training.log_every", true, "applies from the next step"},
    {"training.threads", true, "applies at once"},
    {"training.checkpoint_on_signal", true, "applies at once"},
    {"training.checkpoint_format", true, "applies from the next checkpoint; either format resumes"},
    {"training.async_checkpoint", true, "applies from the next checkpoint"},
    {"training.trace", true, "applies at once"},
    {"training.tensorboard", true, "applies at once (each start writes an event file of its own)"},
    {"training.trace_start", true, "applies at once"},
    {"training.trace_steps", true, "applies at once"},
    {"training.on_nonfinite_loss", true, "applies from the next step"},
    {"training.clip_grad_norm", true, "applies from the next step"},
    {"training.precision", true, "applies from the next step (weights and optimizer state are fp32 either way)"},
    {"training.early_stopping", true, "applies from the next evaluation; the earlier epochs' metrics count"},
    {"training.keep_best", true, "applies from the next evaluation"},
    {"training.keep_best_by", true, "applies from the next evaluation; checkpoints/best/ is ranked anew"},
    {"training.seed", false, "the seed draws the train/test split and the sample order"},
    {"training.batch_size", false, "the checkpoint's step count and sample position assume the old batch size"},
    {"training.accumulate_grad_batches", false, "the checkpoint's step count assumes the old accumulation"},
    {"training.drop_last", false, "the checkpoint's step count assumes the old batches"},
    {"training.join", false, "the checkpoint's step count assumes the old shards (padded or not)"},
    {"distributed.strategy", true, "checkpoints hold the consolidated model and optimizer, which every strategy loads"},
    {"distributed.backend", true, "the checkpoint does not depend on the backend"},
    {"distributed.device", true, "the checkpoint is loaded onto the new device"},
    {"distributed.nproc_per_node", true, "checkpoints hold the consolidated model and optimizer, whatever the world size"},
    {"distributed.nnodes", true, "the world may change: checkpoints hold the consolidated model and optimizer"},
    {"distributed.timeout_s", true, "applies at once"},
    {"distributed.shard_size", true, "checkpoints hold the consolidated model and optimizer, whatever the mesh"},
    {"distributed.find_unused_parameters", true, "applies at once"},
    {"distributed.bucket_cap_mb", true, "applies at once"},
    {"distributed.first_bucket_cap_mb", true, "applies at once"},
    {"distributed.fsdp_backward_prefetch", true, "applies at once"},
    {"distributed.fsdp_unit_mb", true, "checkpoints are consolidated, whatever the units"},
    {"distributed.comm_hook", true, "the hook only averages gradients; its own state (PowerSGD's) starts afresh"},
};
const Rule kUnlisted = {"", false, "not known to be safe to change on resume"};

const Rule& ruleFor(const std::string& key) {
  const Rule* best = &kUnlisted;
  size_t bestLength = 0;
  for (const Rule& rule : kRules) {
    const std::string prefix = rule.prefix;
    const bool matches = key == prefix || (key.size() > prefix.size() && key.compare(0, prefix.size(), prefix) == 0 &&
                                           key[prefix.size()] == '.');
    if (matches && prefix.size() > bestLength) {
      best = &rule;
      bestLength = prefix.size();
    }
  }
  return *best;
}

// Leaves of `j` by dotted path; lists and scalars are leaves.
void flatten(const nlohmann::json& j, const std::string& prefix, std::map<std::string, nlohmann::json>& out) {
  if (j.is_object() && !j.empty()) {
    for (auto it = j.begin(); it != j.end(); ++it) flatten(it.value(), prefix.empty() ? it.key() : prefix + "." + it.key(), out);
  } else if (!prefix.empty()) {
    out[prefix] = j;
  }
}

std::string shownValue(const std::map<std::string, nlohmann::json>& values, const std::string& key) {
  auto it = values.find(key);
  return it == values.end() ? "(absent)" : it->second.dump();
}

}  // namespace

std::vector<ConfigChange> compareForResume(const nlohmann::json& saved, const nlohmann::json& current) {
  std::map<std::string, nlohmann::json> before, after;
  flatten(saved, "", before);
  flatten(current, "", after);
  std::set<std::string> keys;
  for (const auto& [key, value] : before) keys.insert(key);
  for (const auto& [key, value] : after) keys.insert(key);
  // Sections whose plugin changed: only their "name" is reported.
  std::set<std::string> renamed;
  for (const std::string& key : keys) {
    const size_t dot = key.find('.');
    if (dot != std::string::npos && key.substr(dot + 1) == "name" && shownValue(before, key) != shownValue(after, key)) {
      renamed.insert(key.substr(0, dot));
    }
  }
  std::vector<ConfigChange> changes;
  for (const std::string& key : keys) {
    const std::string old = shownValue(before, key), now = shownValue(after, key);
    if (old == now) continue;
    const size_t dot = key.find('.');
    if (dot != std::string::npos && renamed.count(key.substr(0, dot)) && key.substr(dot + 1) != "name") continue;
    const Rule& rule = ruleFor(key);
    changes.push_back({key, old, now, rule.allowed, rule.reason});
  }
  return changes;
}

std::vector<ConfigChange> checkResumeChanges(const std::string& runDir, const nlohmann::json& saved,
                                             const nlohmann::json& current) {
  std::vector<ConfigChange> changes = compareForResume(saved, current), allowed;
  std::string refused;
  for (const ConfigChange& c : changes) {
    if (c.allowed) {
      allowed.push_back(c);
    } else {
      refused += fmt::format("{}{} {} -> {} ({})", refused.empty() ? "" : "; ", c.key, c.before, c.after, c.reason);
    }
  }
  if (!refused.empty()) {
    fail<UsageError>(
        "--resume: the experiment differs from the one that made {} in what its checkpoint cannot follow: {}. HINT: "
        "start a new run with another --out, or resume with the settings in {}/config.json",
        runDir, refused, runDir);
  }
  return allowed;
}

}  // namespace ddp
