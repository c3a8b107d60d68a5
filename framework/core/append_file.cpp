#include "framework/core/append_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "framework/core/errors.hpp"
#include "framework/core/system.hpp"

namespace ddp {
namespace {

// Writes all of `text` to fd; returns 0 or the errno of the write that failed.
int writeAll(int fd, const std::string& text) { return writeFully(fd, text.data(), text.size()); }

}  // namespace

AppendFile::~AppendFile() { close(); }

void AppendFile::open(const std::string& path, bool truncate) {
  close();
  const int flags = O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (truncate ? O_TRUNC : 0);
  fd_ = ::open(path.c_str(), flags, 0644);
  if (fd_ < 0) fail<std::runtime_error>("cannot open {} for writing: {}", path, errnoText(errno));
  path_ = path;
}

void AppendFile::append(const std::string& record) {
  DDP_CHECK(fd_ >= 0, "AppendFile::append before open");
  struct stat st {};
  const bool sized = ::fstat(fd_, &st) == 0;
  const int err = writeAll(fd_, record);
  if (err == 0) return;
  // No torn record: cut the file back to where this one began.
  if (sized && ::ftruncate(fd_, st.st_size) != 0) {
    fail<std::runtime_error>("cannot write {}: {} (and cannot remove the partial record: {})", path_, errnoText(err),
                             errnoText(errno));
  }
  fail<std::runtime_error>("cannot write {}: {}", path_, errnoText(err));
}

void AppendFile::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void writeFileAtomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail<std::runtime_error>("cannot write {}: {}", tmp, errnoText(errno));
  int err = writeAll(fd, text);
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err == 0 && std::rename(tmp.c_str(), path.c_str()) != 0) err = errno;
  if (err != 0) {
    ::unlink(tmp.c_str());
    fail<std::runtime_error>("cannot write {}: {}", path, errnoText(err));
  }
}

}  // namespace ddp
