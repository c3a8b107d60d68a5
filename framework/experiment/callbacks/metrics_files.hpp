// MetricsFiles: rank 0's metrics.jsonl and metrics.csv in the run folder,
// one record per epoch. The columns follow the dataset's task:
//   classification  epoch, train_loss, test_loss, test_accuracy, seconds
//   next_token      epoch, train_loss, test_loss, test_perplexity, test_accuracy, seconds
//                   (losses per token; accuracy of the next-token guesses)
//   regression      epoch, train_loss, test_loss, test_rmse, seconds
// then, in the JSON record, any EpochMetrics::extra added by earlier
// callbacks. A value an epoch does not have (no evaluation) or that is not a
// finite number (a NaN loss) is JSON null and an empty CSV field: never nan
// or inf, which JSON readers refuse.
//
// A new run starts both files empty (the CSV with its header). A resumed
// one keeps the whole records of epochs up to its checkpoint: a crash may
// have left records of later epochs, which run again, and a torn line; the
// files are rewritten (or created) through a temporary file and a rename,
// so a kill meanwhile leaves the old ones. Both stay open; each record is
// one write (AppendFile), and a disk that refuses one ends the run with
// "cannot write PATH: No space left on device", the files cut back to their
// whole records.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "framework/core/append_file.hpp"

#include "framework/experiment/callbacks/callback.hpp"

namespace ddp {

class TensorBoardLog;

class MetricsFiles : public TrainerCallback {
 public:
  // `tensorboard` (may be null) also receives each record.
  explicit MetricsFiles(std::shared_ptr<TensorBoardLog> tensorboard = nullptr)
      : tensorboard_(std::move(tensorboard)) {}
  // Each epoch once in each file: an elastic writer that takes over writes
  // the records the lost writer had not (its last epoch may be in one file
  // and not the other), and a second call for an epoch writes nothing.
  bool writerOnly() const override { return true; }
  void onTrainBegin(Trainer& trainer) override;
  void onEpochEnd(Trainer& trainer, EpochEnd& end) override;

 private:
  AppendFile jsonl_, csv_;
  bool opened_ = false;
  int64_t lastJsonl_ = 0, lastCsv_ = 0;  // the last epoch each file holds
  std::vector<std::string> columns_;  // after epoch, train_loss, test_loss; before seconds
  std::shared_ptr<TensorBoardLog> tensorboard_;
};

}  // namespace ddp
