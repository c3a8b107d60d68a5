// TensorBoardLog: a run's records in TensorBoard's format
// (training.tensorboard), so that `tensorboard --logdir runs/` shows them.
//
// Contract
// - The writer (rank 0, or whoever holds that role in an elastic run)
//   writes RUN_DIR/events.out.tfevents.* (framework/interop/
//   tensorboard_events.hpp); each start of a run (a resume, a restart)
//   writes a file of its own, which TensorBoard reads together.
// - At the start: the resolved experiment (config.json) as a text summary,
//   tag "config".
// - Every steps.jsonl record (callbacks/step_metrics.hpp) becomes scalars
//   "step/<key>" and every metrics.jsonl record (callbacks/metrics_files.hpp)
//   scalars "epoch/<key>", for each number the record holds (null values
//   skipped; the x axes "step", "epoch" and "time" are not scalars), at the
//   optimizer step count of the record and its wall-clock time. The
//   callbacks that write those records hand them over (record()).
// - A disk that refuses a write ends the run, as for the JSON records.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>

#include "framework/experiment/callbacks/callback.hpp"

namespace ddp {

class TensorBoardEventWriter;

class TensorBoardLog : public TrainerCallback {
 public:
  TensorBoardLog();
  ~TensorBoardLog() override;
  void onTrainBegin(Trainer& trainer) override;
  void onTrainEnd(Trainer& trainer) override;
  // One record of steps.jsonl ("step") or metrics.jsonl ("epoch"), at
  // optimizer step `step`; nothing unless this rank is the writer.
  void record(Trainer& trainer, const std::string& group, const nlohmann::ordered_json& record, int64_t step);

 private:
  void open(Trainer& trainer);
  std::unique_ptr<TensorBoardEventWriter> writer_;
};

}  // namespace ddp
