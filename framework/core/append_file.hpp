// AppendFile: a file that grows by whole records (train.log, metrics.jsonl,
// metrics.csv), for programs that read it while a run writes it.
//
// Contract
// - open() creates the file (mode 0644) or opens it to append, or empties
//   it when asked; a failure throws std::runtime_error naming the path and
//   the reason.
// - append() writes the record with one write(2) (the rest of a short write
//   again), so a reader never sees half a record from a healthy disk. When
//   the disk refuses (full, quota, I/O error), the file is cut back to its
//   length before the record and std::runtime_error "cannot write PATH: No
//   space left on device" (the errno text) is thrown: what was written
//   before stays whole.
// - Not thread-safe; one writer per file.
#pragma once

#include <string>

namespace ddp {

class AppendFile {
 public:
  AppendFile() = default;
  ~AppendFile();
  AppendFile(const AppendFile&) = delete;
  AppendFile& operator=(const AppendFile&) = delete;

  void open(const std::string& path, bool truncate = false);
  bool isOpen() const { return fd_ >= 0; }
  void append(const std::string& record);
  void close();
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

// Writes `text` to `path` whole or not at all: a temporary file beside it,
// written, flushed to disk and renamed over it. On failure the temporary is
// removed, `path` keeps what it held, and std::runtime_error names the path
// and the reason.
void writeFileAtomically(const std::string& path, const std::string& text);

}  // namespace ddp
