// TensorBoardLog (tensorboard_log.hpp).
#include "framework/experiment/callbacks/tensorboard_log.hpp"

#include <chrono>
#include <utility>
#include <vector>

#include "framework/experiment/trainer.hpp"
#include "framework/interop/tensorboard_events.hpp"

namespace ddp {
namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

TensorBoardLog::TensorBoardLog() = default;
TensorBoardLog::~TensorBoardLog() = default;

void TensorBoardLog::open(Trainer& trainer) {
  writer_ = std::make_unique<TensorBoardEventWriter>(trainer.options().runDir);
  const Json& resolved = trainer.config().resolved;
  if (!resolved.is_null()) {
    // Markdown: indented four spaces, the JSON shows as a code block.
    std::string text;
    const std::string dumped = resolved.dump(2);
    size_t start = 0;
    while (start <= dumped.size()) {
      const size_t end = dumped.find('\n', start);
      text += "    " + dumped.substr(start, end == std::string::npos ? std::string::npos : end - start) + "\n";
      if (end == std::string::npos) break;
      start = end + 1;
    }
    writer_->addText("config", text, trainer.steps(), now());
  }
}

void TensorBoardLog::onTrainBegin(Trainer& trainer) {
  if (trainer.isWriter()) open(trainer);
}

void TensorBoardLog::onTrainEnd(Trainer&) {
  if (writer_) writer_->flush();
}

void TensorBoardLog::record(Trainer& trainer, const std::string& group, const nlohmann::ordered_json& record,
                            int64_t step) {
  if (!trainer.isWriter()) return;
  if (!writer_) open(trainer);  // became the writer after a rank left (elastic)
  std::vector<std::pair<std::string, double>> scalars;
  for (const auto& [key, value] : record.items()) {
    if (key == "step" || key == "epoch" || key == "time" || !value.is_number()) continue;
    scalars.emplace_back(group + "/" + key, value.get<double>());
  }
  const double time = record.contains("time") && record["time"].is_number() ? record["time"].get<double>() : now();
  writer_->addScalars(scalars, step, time);
}

}  // namespace ddp
