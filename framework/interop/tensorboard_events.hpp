// TensorBoard event files: scalars and texts of a run written where
// `tensorboard --logdir` finds them, without TensorFlow, TensorBoard or
// protobuf in the build.
//
// Contract
// - The writer creates DIR/events.out.tfevents.<unix seconds>.<hostname>.
//   <pid>.<counter> (DIR must exist; the counter counts the writers this
//   process made, so two of them never share a name) with open(2)
//   O_WRONLY|O_CREAT|O_EXCL|O_CLOEXEC, mode 0644: an existing file is never
//   appended to or overwritten. Its first event is Event{wall_time: now,
//   file_version: "brain.Event:2"}, which TensorBoard expects first.
// - The file is a TFRecord stream: each record is the payload's length
//   (uint64, little-endian), the masked CRC-32C of those 8 bytes (uint32,
//   little-endian), the payload (one serialized Event), and the payload's
//   masked CRC-32C. Masking is TFRecord's: ((crc >> 15) | (crc << 17)) +
//   0xa282ead8 in uint32 arithmetic.
// - Event (tensorflow/core/util/event.proto): wall_time = 1 (double), step =
//   2 (int64), file_version = 3 (string), summary = 5. Summary: repeated
//   Value value = 1. Summary.Value: tag = 1, simple_value = 2 (float),
//   tensor = 8 (TensorProto), metadata = 9 (SummaryMetadata{plugin_data = 1
//   {plugin_name = 1}}). TensorProto: dtype = 1 (DT_STRING = 7),
//   tensor_shape = 2 (empty: a scalar), string_val = 8.
// - The protobuf encoding is written here by hand: the four messages need a
//   dozen fields, and libprotobuf with generated code would be the heaviest
//   part of the build for them. Fields are written in field-number order,
//   and a step of 0 is left out, as protobuf itself would write them.
// - addScalar / addScalars: one Event per call, with the given step and
//   wall time (seconds since the epoch), holding one Summary.Value per
//   scalar. simple_value is a float, so values are rounded to float32 (a
//   finite value beyond float's range becomes +-inf); NaN and +-inf are
//   written as they are (TensorBoard shows them). addScalars with no values
//   writes nothing.
// - addText: one Event whose value TensorBoard's Text tab shows (markdown):
//   metadata.plugin_data.plugin_name "text", tensor {dtype DT_STRING,
//   tensor_shape {}, string_val [text]}. The text is stored as bytes, as
//   given.
// - Tags must be valid UTF-8 (a protobuf string; a reader may reject the
//   whole file otherwise): std::invalid_argument names the tag otherwise,
//   and nothing is written.
// - Every add* ends with flush(): the file holds every event once the call
//   returns (write(2), no fsync), so a TensorBoard watching the run sees it.
//   A write(2) that fails (disk full, I/O error) after EINTR and short
//   writes are retried cuts the file back to its last whole record, drops
//   that call's event and throws std::runtime_error "cannot write PATH:
//   <errno text>"; the file stays readable, and later calls may succeed.
//   When the cut itself fails, the message says so and the writer closes
//   the file: every later call throws. Failing to create the file (or to
//   write its first event, which removes it again) throws "cannot create
//   PATH: <errno text>" or "cannot write PATH: ...".
// - The destructor flushes what is left and closes the file; it never
//   throws. Not thread-safe: one thread per writer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ddp {

class TensorBoardEventWriter {
 public:
  explicit TensorBoardEventWriter(const std::string& dir);
  ~TensorBoardEventWriter();
  TensorBoardEventWriter(const TensorBoardEventWriter&) = delete;
  TensorBoardEventWriter& operator=(const TensorBoardEventWriter&) = delete;

  // The event file's path.
  const std::string& path() const { return path_; }

  void addScalar(const std::string& tag, double value, int64_t step, double wallTime);
  void addScalars(const std::vector<std::pair<std::string, double>>& values, int64_t step, double wallTime);
  void addText(const std::string& tag, const std::string& text, int64_t step, double wallTime);

  // Writes whatever is buffered (every add* already does).
  void flush();

 private:
  void appendRecord(const std::string& event);

  int fd_ = -1;
  std::string path_;
  std::string buffer_;  // whole records not yet written
};

// CRC-32C (Castagnoli; reflected polynomial 0x82F63B78), continuing from
// `crc` (the CRC of the bytes before), so crc32c(b, nb, crc32c(a, na)) is the
// CRC of a followed by b. crc32c("123456789", 9) == 0xE3069283.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);

// TFRecord's masked CRC-32C of the bytes.
uint32_t maskedCrc32c(const void* data, size_t n);

}  // namespace ddp
