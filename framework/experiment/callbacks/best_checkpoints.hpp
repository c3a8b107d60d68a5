// BestCheckpoints: training.keep_best. Keeps the K best checkpoints by
// training.keep_best_by (monitor.hpp) in checkpoints/best/, beside the
// periodic ones (which resume reads; it never reads these).
//
// Contract
// - Added on every rank: writing is collective (Trainer::saveCheckpointAs,
//   atomic: a temporary file and a rename). Only epochs that record the
//   metric count.
// - Rank 0 decides whether the epoch enters the K best (fewer than K kept,
//   or better than the worst kept; a tie keeps the older) and broadcasts it.
//   It then writes checkpoints/best/epoch_NNNNNN.pt, removes the one that
//   fell out, and rewrites checkpoints/best/index.json atomically:
//   {"monitor", "mode", "best": [{"epoch", "value", "file"}, ...]}, best
//   first. bestCheckpoint(runDir) (run_folder.hpp) reads it: what
//   `ddp-run --sample RUN --checkpoint best` loads.
// - On resume, entries of epochs after the checkpoint resumed from (an
//   abandoned attempt's) are dropped with their files; a changed
//   keep_best_by or mode ranks the kept ones anew from metrics.jsonl.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "framework/experiment/callbacks/callback.hpp"

namespace ddp {

class BestCheckpoints : public TrainerCallback {
 public:
  void onTrainBegin(Trainer& trainer) override;
  void onEpochEnd(Trainer& trainer, EpochEnd& end) override;

  struct Entry {
    int64_t epoch = 0;
    double value = 0;
  };

 private:
  void writeIndex(Trainer& trainer) const;
  // Ranks kept_, drops (and deletes) those beyond keep_best, rewrites index.json.
  void keepTheBest(Trainer& trainer);
  void restore(Trainer& trainer, int64_t upTo);
  bool restored_ = false;
  void sortKept();
  std::vector<Entry> kept_;  // rank 0, best first
  bool maximize_ = false;
};

}  // namespace ddp
