// AsyncShardWriter: one rank's part of a sharded checkpoint
// (sharded_checkpoint.hpp), written on a background thread while training
// goes on (training.async_checkpoint).
//
// The caller copies what its rank holds to host memory at a step boundary
// (the slices' tensors must own their memory: nothing of the live model)
// and hands it to start(); that copy is all training waits for. The thread
// writes the rank's file (synced, renamed into place). Rank 0's thread then
// waits until every rank's file is in the folder (a shared filesystem, as
// for every sharded checkpoint) and writes the index, so the checkpoint
// exists only once every shard is on disk. No collective runs on the
// thread: ranks meet through the folder alone.
//
// Contract
// - One save at a time: start() waits for the previous one first (the
//   next save waits for the previous), and throws its error if it failed.
// - A rank whose write fails leaves `rank_RRRRR.SAVE.failed` (its error) beside
//   the files; rank 0's thread sees it and writes no index. check() throws
//   a pending failure (the caller polls it at each step boundary: a failed
//   background write fails the job at the next step, never silently);
//   wait() waits for the save, then does the same.
// - Rank 0 waits for the other files at most `timeout`; past it the save
//   fails naming the ranks whose files are missing.
// - cancel() (a rank died and the world changes: the save can no longer
//   complete) stops waiting, writes no index and removes this save's files
//   from rank 0 (the folder too, if nothing else is in it); it is not an
//   error.
// - The destructor cancels a save in progress and joins the thread.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "framework/parallel/held_state.hpp"

namespace ddp {

class AsyncShardWriter {
 public:
  AsyncShardWriter();
  ~AsyncShardWriter();
  AsyncShardWriter(const AsyncShardWriter&) = delete;
  AsyncShardWriter& operator=(const AsyncShardWriter&) = delete;

  // `meta` is rank 0's index metadata (ignored on other ranks);
  // `stillCurrent` goes to writeShardIndex (rank 0).
  void start(const std::string& dir, int rank, int world, const std::string& saveId, std::vector<StateSlice> slices,
             nlohmann::json meta, std::chrono::milliseconds timeout, std::function<bool()> stillCurrent = nullptr);
  bool busy() const;
  void check();
  void wait();
  void cancel();
  // The folder of the save in progress or last completed ("" before any).
  std::string lastDir() const;
  // Seconds the last completed save took on its thread (0 before any).
  double lastWriteSeconds() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp
