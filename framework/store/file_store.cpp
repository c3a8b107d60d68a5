// FileStore: the map lives in one append-only file.
//
// File format: an 8-byte header "DDPFSv1\n", then records, each
//   key length (u64 LE) | key | value length (u64 LE) | value
// Reading replays the records in order, so the last write of a key wins.
// Appending never rewrites earlier bytes, and every operation holds an
// exclusive flock(2), so readers in other processes never see a torn record.
// A record cut short (a writer killed mid-write) is ignored when reading and
// cut off before the next append. The header keeps us from mistaking (and
// then appending to) some unrelated file at the same path.
#include "framework/store/file_store.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <thread>

#include "framework/core/errors.hpp"
#include "framework/core/system.hpp"
#include "framework/store/store_util.hpp"

namespace ddp {

namespace {

using Clock = std::chrono::steady_clock;
using Map = std::map<std::string, Bytes>;

constexpr char kHeader[8] = {'D', 'D', 'P', 'F', 'S', 'v', '1', '\n'};

void putU64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t getU64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

// The store file, open and exclusively locked for the duration of one
// operation. A fresh open file description per operation means flock also
// excludes other threads and other FileStore objects of this process.
class LockedFile {
 public:
  explicit LockedFile(const std::string& path) : path_(path) {
    do {
      fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    } while (fd_ < 0 && errno == EINTR);
    if (fd_ < 0) {
      const int err = errno;
      fail<StoreError>("FileStore: cannot open '{}': {}{}", path, errnoText(err),
                       err == ENOENT ? ". HINT: the directory must exist (it is not created)" : "");
    }
    int rc;
    do {
      rc = ::flock(fd_, LOCK_EX);
    } while (rc != 0 && errno == EINTR);
    if (rc != 0) {
      const int err = errno;
      ::close(fd_);
      fail<StoreError>("FileStore: cannot lock '{}': {}", path, errnoText(err));
    }
  }
  ~LockedFile() { ::close(fd_); }  // closing releases the lock
  LockedFile(const LockedFile&) = delete;
  LockedFile& operator=(const LockedFile&) = delete;

  // Replays every complete record; remembers where the last one ends.
  Map read() {
    const std::string bytes = readAll();
    Map map;
    end_ = 0;
    if (bytes.size() < sizeof kHeader) {
      // Empty, or a header cut short: nothing stored yet.
      if (std::memcmp(bytes.data(), kHeader, bytes.size()) != 0) notAStoreFile();
      return map;
    }
    if (std::memcmp(bytes.data(), kHeader, sizeof kHeader) != 0) notAStoreFile();
    size_t pos = sizeof kHeader;
    end_ = pos;
    while (true) {
      if (bytes.size() - pos < 8) break;
      const uint64_t keyLen = getU64(bytes.data() + pos);
      if (bytes.size() - pos - 8 < keyLen) break;
      const size_t keyAt = pos + 8;
      const size_t valueLenAt = keyAt + keyLen;
      if (bytes.size() - valueLenAt < 8) break;
      const uint64_t valueLen = getU64(bytes.data() + valueLenAt);
      const size_t valueAt = valueLenAt + 8;
      if (bytes.size() - valueAt < valueLen) break;
      map[bytes.substr(keyAt, keyLen)] = Bytes(bytes.begin() + valueAt, bytes.begin() + valueAt + valueLen);
      pos = valueAt + valueLen;
      end_ = pos;
    }
    size_ = bytes.size();
    return map;
  }

  // Appends one record after the last complete one. Call read() first.
  void append(const std::string& key, const Bytes& value) {
    std::string record;
    if (end_ == 0) record.assign(kHeader, sizeof kHeader);
    putU64(record, key.size());
    record += key;
    putU64(record, value.size());
    record.append(value.begin(), value.end());
    if (size_ > end_ && ::ftruncate(fd_, static_cast<off_t>(end_)) != 0) failTo("truncate a torn record in");
    size_t done = 0;
    while (done < record.size()) {
      const ssize_t n = ::pwrite(fd_, record.data() + done, record.size() - done, static_cast<off_t>(end_ + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) failTo("write");
      done += static_cast<size_t>(n);
    }
    end_ += record.size();
    size_ = end_;
  }

 private:
  std::string readAll() {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) failTo("stat");
    std::string bytes(static_cast<size_t>(st.st_size), '\0');
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::pread(fd_, &bytes[done], bytes.size() - done, static_cast<off_t>(done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) failTo("read");
      if (n == 0) break;  // shorter than fstat said; take what is there
      done += static_cast<size_t>(n);
    }
    bytes.resize(done);
    size_ = done;
    return bytes;
  }

  [[noreturn]] void failTo(const char* what) {
    fail<StoreError>("FileStore: cannot {} '{}': {}", what, path_, errnoText(errno));
  }

  [[noreturn]] void notAStoreFile() {
    fail<StoreError>(
        "FileStore: '{}' is not a store file (it lacks the store's header). HINT: point the store at a new file; it "
        "would otherwise be overwritten",
        path_);
  }

  std::string path_;
  int fd_ = -1;
  size_t end_ = 0;   // where the last complete record ends (0: no header yet)
  size_t size_ = 0;  // the file's size when last read or written
};

bool hasAll(const Map& map, const std::vector<std::string>& keys) {
  for (const auto& k : keys) {
    if (map.count(k) == 0) return false;
  }
  return true;
}

// Calls ready() until it returns true (then returns true) or the deadline
// passes (then false). Polling is the price of needing nothing but a file;
// the pause backs off so that many waiting ranks do not hammer a shared file
// system, yet stays short enough to keep rendezvous quick.
template <typename Ready>
bool pollUntilReady(Clock::time_point deadline, Ready ready) {
  auto pause = std::chrono::milliseconds(2);
  while (!ready()) {
    const auto now = Clock::now();
    if (now >= deadline) return false;
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, std::chrono::milliseconds(10));
  }
  return true;
}

}  // namespace

FileStore::FileStore(std::string path) : path_(std::move(path)) {
  // Creates the file and checks that it is ours, so a bad path fails here.
  std::lock_guard<std::mutex> lock(mutex_);
  LockedFile(path_).read();
}

void FileStore::set(const std::string& key, const Bytes& value) {
  std::lock_guard<std::mutex> lock(mutex_);
  LockedFile file(path_);
  file.read();
  file.append(key, value);
}

Bytes FileStore::get(const std::string& key) {
  const auto limit = effectiveTimeout(std::chrono::milliseconds(0));
  Bytes value;
  const bool found = pollUntilReady(Clock::now() + limit, [&] {
    std::lock_guard<std::mutex> lock(mutex_);
    Map map = LockedFile(path_).read();
    auto it = map.find(key);
    if (it == map.end()) return false;
    value = std::move(it->second);
    return true;
  });
  if (!found) throw StoreTimeout(waitTimeoutMessage(describe(), {key}, limit));
  return value;
}

int64_t FileStore::add(const std::string& key, int64_t delta) {
  std::lock_guard<std::mutex> lock(mutex_);
  LockedFile file(path_);
  Map map = file.read();
  auto it = map.find(key);
  const int64_t value = (it == map.end() ? 0 : parseCounter(key, it->second)) + delta;
  file.append(key, formatCounter(value));
  return value;
}

bool FileStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mutex_);
  return hasAll(LockedFile(path_).read(), keys);
}

void FileStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  const auto limit = effectiveTimeout(timeout);
  if (!pollUntilReady(Clock::now() + limit, [&] { return check(keys); })) {
    throw StoreTimeout(waitTimeoutMessage(describe(), keys, limit));
  }
}

}  // namespace ddp
