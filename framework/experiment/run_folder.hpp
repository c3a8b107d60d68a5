// The run folder's guards: which checkpoints it holds (newest first, by the
// epoch and batch in their names), a lock that makes one job its owner, and
// a check that it can be written before training starts.
//
// Contract
// - Checkpoints are checkpoints/epoch_NNNNNN.pt (after epoch N) and
//   checkpoints/epoch_NNNNNN_batch_MMMMMM.pt (M batches into epoch N, from
//   training.checkpoint_on_signal or an elastic job's stop): epochs count
//   from 1 in names as in every message. Order is by (epochs finished, M) as numbers, so
//   epoch_1000000.pt is newer than epoch_999999.pt; other names (a left-over
//   .tmp) are not checkpoints.
// - RunFolderLock: an flock(2) on RUN_DIR/.lock held for the lock's life
//   (rank 0's process: it dies with the process, so no lock outlives its
//   job). The file says "pid host" of the owner; a second job gets a
//   UsageError "run folder X is in use by pid N (host H)".
// - checkWritable(dir) creates dir and a probe file in it, and removes the
//   probe; a UsageError names the folder and the reason when it cannot.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ddp {

struct CheckpointFile {
  int64_t epoch = 0;  // epochs finished
  int64_t batch = 0;  // batches of the next epoch finished (mid-epoch checkpoints)
  std::string path;
};

// runDir/checkpoints/..., newest first.
std::vector<CheckpointFile> listCheckpoints(const std::string& runDir);

// The newest checkpoint in runDir/checkpoints, or "" when there is none.
std::string newestCheckpoint(const std::string& runDir);

// training.keep_best's checkpoints in runDir/checkpoints/best/ (files
// named epoch_NNNNNN.pt), by epoch; and the best of them by its
// index.json (callbacks/best_checkpoints.hpp), or "" when the run kept
// none. UsageError for an index.json that cannot be read.
struct BestCheckpoint {
  int64_t epoch = 0;
  std::string path;
};
std::vector<BestCheckpoint> listBestCheckpoints(const std::string& runDir);
std::string bestCheckpoint(const std::string& runDir);
// index.json's entries, best first, whatever exists on disk (none without
// an index). An entry whose file would leave checkpoints/ is a UsageError.
std::vector<BestCheckpoint> indexedBestCheckpoints(const std::string& runDir);

// The file name of a checkpoint after `epoch` epochs finished and `batch`
// batches of the next one (named by that next epoch, 1-based).
// A sharded checkpoint is a folder named so with ".shards" for ".pt"
// (framework/checkpoint/sharded_checkpoint.hpp), listed only once its
// index.json exists.
std::string checkpointFileName(int64_t epoch, int64_t batch = 0, bool sharded = false);

class RunFolderLock {
 public:
  explicit RunFolderLock(const std::string& runDir);  // throws UsageError when held
  ~RunFolderLock();
  RunFolderLock(const RunFolderLock&) = delete;
  RunFolderLock& operator=(const RunFolderLock&) = delete;

 private:
  int fd_ = -1;
};

void checkWritable(const std::string& dir);

}  // namespace ddp
