// Sharded checkpoints: every rank writes what it holds, in parallel, and a
// small index written last says where each range of each tensor lies, so
// that a load on any world size or strategy reads only the ranges it needs.
//
// Layout: a folder (the trainer names it checkpoints/epoch_NNNNNN.shards)
// holding
// - rank_RRRRR.SAVE.safetensors, one per rank (SAVE: the save's id): that
//   rank's slices
//   (held_state.hpp's StateSlice), each a 1-D tensor, and in the header's
//   __metadata__ "ddp.save" (the save's id) and "ddp.slices" (JSON: per
//   tensor of the file, the logical tensor's name, its whole shape, the
//   first element the slice holds, and "int"/"double"/"bool" for a value
//   that was not a tensor);
// - index.json: {"format": "ddp-sharded", "version": 1, "save": ID,
//   "files": [{"name", "bytes"}], "meta": {...the trainer's...},
//   "tensors": {NAME: {"dtype", "shape", "scalar", "shards": [{"file",
//   "offset", "numel", "begin"}]}}}, begin being the byte of the file where
//   the range starts.
//
// Contract
// - writeShardFile(): this rank's file, written to a temporary name, synced
//   and renamed. writeShardIndex() (one rank, once every file is written):
//   reads the files' headers, checks that they belong to this save and
//   that the ranges of each tensor tile it exactly (a missing rank, or a
//   range written twice, fails naming the tensor and the elements), writes
//   index.json through a synced temporary file and a rename, and syncs the
//   folder. The checkpoint exists from then on: a folder without
//   index.json is not one (isShardedCheckpoint false), so a crash at any
//   moment leaves the previous checkpoint as the newest whole one.
// - Every file a save writes carries its id (or a hash of it) in its name,
//   temporaries included. Two saves into one folder (the same point again, or
//   a rank left out of an elastic job that wakes and finishes its write
//   after the others saved without it) never write the same file: a whole
//   earlier checkpoint stays readable until the new index replaces it, and
//   a stale writer cannot overwrite or interleave with a shard of the new
//   save. Once its index is in place, writeShardIndex() removes the files
//   of other saves (rank_*, index.json.*.tmp), unless by then the index is
//   another save's. removeShardSave() removes one save's files (a save that
//   failed), and the folder if nothing else is left in it; not those of a
//   save whose index is in place (a caller that failed after the rename).
//   Neither throws. A rank 0 left out of an elastic job that wakes with
//   its index written asks `stillCurrent` before the rename and gives up;
//   only a freeze between that question and the rename could still put its
//   index (a whole, older save of the same point) over the new one.
// - ShardedCheckpoint opens a folder by its index. verify() checks every
//   file the index names: present, of the size the index records (a
//   truncated file), of this save (shards of two saves); each failure a
//   UsageError naming the file. read() checks the files it touches the
//   same way (once each) and reads only the bytes of the range asked for.
// - Tensors are read as saved (dtype, values); the caller converts.
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "framework/parallel/held_state.hpp"

namespace ddp {

// Whether `path` is a folder holding index.json.
bool isShardedCheckpoint(const std::string& path);

void writeShardFile(const std::string& dir, int rank, const std::string& saveId, const std::vector<StateSlice>& slices);
// Returns the bytes of all files. `stillCurrent`, when given, is asked
// once the index's temporary file is synced, just before its rename: false
// (an elastic group that moved on without this rank) leaves no index and
// throws.
int64_t writeShardIndex(const std::string& dir, int files, const std::string& saveId, const nlohmann::json& meta,
                        const std::function<bool()>& stillCurrent = nullptr);

std::string shardFileName(int rank, const std::string& saveId);
// A rank's marker of a failed background write (async_shard_writer.hpp).
std::string shardFailureFileName(int rank, const std::string& saveId);
void removeShardSave(const std::string& dir, const std::string& saveId);

class ShardedCheckpoint {
 public:
  explicit ShardedCheckpoint(const std::string& dir);
  ~ShardedCheckpoint();
  ShardedCheckpoint(const ShardedCheckpoint&) = delete;
  ShardedCheckpoint& operator=(const ShardedCheckpoint&) = delete;

  const std::string& path() const;
  const nlohmann::json& meta() const;
  int files() const;
  // The path of file `f` (0 <= f < files()), as the index names it.
  std::string filePath(int f) const;
  // The save's id (its files carry it in their names).
  std::string saveId() const;
  int64_t totalBytes() const;
  void verify() const;

  bool has(const std::string& name) const;
  std::vector<std::string> names() const;
  std::vector<std::string> entries(const std::string& prefix) const;
  std::vector<int64_t> shape(const std::string& name) const;
  at::ScalarType dtype(const std::string& name) const;
  // "int", "double", "bool" or "".
  std::string scalar(const std::string& name) const;
  // Elements [offset, offset + numel) of the flattened tensor, 1-D.
  at::Tensor read(const std::string& name, int64_t offset, int64_t numel) const;
  // The whole tensor in its shape.
  at::Tensor readWhole(const std::string& name) const;
  StateReader reader() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp
