// Resume rules: which settings of an experiment may change when a run
// continues from its checkpoint (ddp-run --resume), in one table.
//
// Contract
// - compareForResume(saved, current) compares two resolved configs
//   (ExperimentConfig::resolved; the saved one is the run folder's
//   config.json) key by key, a key being the dotted path of a value
//   ("model.layers", "optimizer.lr"); lists count as one value.
// - Each changed, added or removed key is looked up in the table by its
//   longest matching prefix. A key the table lists as safe is allowed: the
//   new value applies from the resumed step on (epochs, lr and the other
//   optimizer hyper-parameters, the scheduler, eval/save cadence, logging,
//   tracing, threads, max_steps, the distributed settings, the parallel
//   strategy included). Every other key is refused, with the table's
//   reason: the checkpoint was made for the old value (model and dataset
//   shapes, the seed that draws the split, the loss, the optimizer kind
//   whose state it holds, batch size, accumulation, drop_last and join,
//   which define a step). A new key is refused until it is listed as safe;
//   that is the guard.
// - When a plugin's name changed (optimizer.name adam -> sgd), only that key
//   is reported for its section: the other keys belong to another plugin.
// - World size and strategy may change: every built-in strategy saves the
//   consolidated model and optimizer, so a run may resume under another
//   strategy or on another number of ranks (it then follows another sample
//   order than an uninterrupted run would).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ddp {

struct ConfigChange {
  std::string key;     // "model.layers"
  std::string before;  // JSON text, or "(absent)"
  std::string after;
  bool allowed = false;
  std::string reason;  // why it is refused or how it applies
};

std::vector<ConfigChange> compareForResume(const nlohmann::json& saved, const nlohmann::json& current);

// Throws UsageError naming every refused change (key, old -> new, reason)
// and a HINT, when there is one; returns the allowed changes otherwise.
std::vector<ConfigChange> checkResumeChanges(const std::string& runDir, const nlohmann::json& saved,
                                             const nlohmann::json& current);

}  // namespace ddp
