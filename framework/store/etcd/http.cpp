#include "framework/store/etcd/http.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <fmt/format.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "framework/core/system.hpp"

namespace ddp::etcd {

using tcpstore::ConnectionLost;
using tcpstore::IoTimeout;

namespace {

// Replies bigger than this are not etcd's (its own limit is a few MiB).
constexpr size_t kMaxReply = size_t{256} << 20;

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

HttpConnection::HttpConnection(const std::string& host, uint16_t port, Clock::time_point deadline)
    : host_(host), endpoint_(tcpstore::formatHostPort(host, port)) {
  tcpstore::AddrInfoList addresses;
  const std::string resolveError = tcpstore::resolve(host, port, /*passive=*/false, &addresses);
  if (!resolveError.empty()) throw ConnectionLost{fmt::format("cannot resolve {}: {}", host, resolveError)};
  std::string error = "no address";
  for (const addrinfo* a = addresses.list; a != nullptr; a = a->ai_next) {
    fd_ = tcpstore::connectTo(*a, deadline, &error);
    if (fd_ >= 0) return;
  }
  throw ConnectionLost{error};
}

HttpConnection::~HttpConnection() { tcpstore::closeFd(fd_); }

bool HttpConnection::idleAndOpen() const {
  if (!reusable() || !in_.empty()) return false;
  char c;
  const ssize_t n = ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

void HttpConnection::sendRequest(const std::string& path, const std::string& json, Clock::time_point deadline) {
  if (fd_ < 0 || broken_ || streaming_) throw ConnectionLost{"the connection is not reusable"};
  const std::string request = fmt::format(
      "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{}", path,
      endpoint_, json.size(), json);
  broken_ = true;  // until the whole reply is read
  tcpstore::sendAll(fd_, request, deadline);
}

bool HttpConnection::fill(Clock::time_point deadline) {
  char buf[65536];
  while (true) {
    const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n > 0) {
      in_.append(buf, static_cast<size_t>(n));
      if (in_.size() > kMaxReply) throw ConnectionLost{"malformed reply: over 256 MiB"};
      return true;
    }
    if (n == 0) throw ConnectionLost{"the server closed the connection"};
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) throw ConnectionLost{errnoText(errno)};
    if (!tcpstore::waitReady(fd_, POLLIN, deadline)) return false;
  }
}

bool HttpConnection::readLine(std::string* line, Clock::time_point deadline) {
  size_t end;
  while ((end = in_.find("\r\n")) == std::string::npos) {
    if (in_.size() > 65536) throw ConnectionLost{"malformed reply: a header line over 64 KiB"};
    if (!fill(deadline)) return false;
  }
  line->assign(in_, 0, end);
  in_.erase(0, end + 2);
  return true;
}

bool HttpConnection::readExactly(size_t n, std::string* out, Clock::time_point deadline) {
  while (in_.size() < n) {
    if (!fill(deadline)) return false;
  }
  out->append(in_, 0, n);
  in_.erase(0, n);
  return true;
}

int HttpConnection::readHead(Clock::time_point deadline, long long* contentLength, bool* chunked) {
  std::string line;
  if (!readLine(&line, deadline)) throw IoTimeout{};
  // "HTTP/1.1 200 OK"
  if (line.rfind("HTTP/1.", 0) != 0 || line.size() < 12) {
    throw ConnectionLost{fmt::format("malformed reply: status line '{}' (is this etcd's client port?)", line)};
  }
  const int status = std::atoi(line.c_str() + 9);
  *contentLength = -1;
  *chunked = false;
  while (true) {
    if (!readLine(&line, deadline)) throw IoTimeout{};
    if (line.empty()) break;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string name = lower(line.substr(0, colon));
    std::string value = line.substr(colon + 1);
    while (!value.empty() && value.front() == ' ') value.erase(0, 1);
    if (name == "content-length") *contentLength = std::atoll(value.c_str());
    if (name == "transfer-encoding" && lower(value).find("chunked") != std::string::npos) *chunked = true;
    if (name == "connection" && lower(value).find("close") != std::string::npos) closeAfter_ = true;
  }
  return status;
}

bool HttpConnection::readChunk(Clock::time_point deadline) {
  std::string sizeLine;
  if (!readLine(&sizeLine, deadline)) return false;
  char* end = nullptr;
  const unsigned long long size = std::strtoull(sizeLine.c_str(), &end, 16);
  if (end == sizeLine.c_str()) throw ConnectionLost{fmt::format("malformed reply: chunk size '{}'", sizeLine)};
  if (size > kMaxReply) throw ConnectionLost{"malformed reply: a chunk over 256 MiB"};
  if (size == 0) {
    std::string trailer;
    do {
      if (!readLine(&trailer, deadline)) throw IoTimeout{};  // the reply is not whole: never reused
    } while (!trailer.empty());
    throw ConnectionLost{"the stream ended"};
  }
  std::string data;
  if (!readExactly(static_cast<size_t>(size) + 2, &data, deadline)) throw IoTimeout{};  // mid-chunk: give up
  stream_.append(data, 0, static_cast<size_t>(size));
  return true;
}

HttpReply HttpConnection::post(const std::string& path, const std::string& json, Clock::time_point deadline) {
  sendRequest(path, json, deadline);
  HttpReply reply;
  long long length = -1;
  bool chunked = false;
  reply.status = readHead(deadline, &length, &chunked);
  if (chunked) {
    try {
      while (true) {
        if (!readChunk(deadline)) throw IoTimeout{};
      }
    } catch (const ConnectionLost& e) {
      if (e.reason != "the stream ended") throw;
    }
    reply.body = std::move(stream_);
    stream_.clear();
  } else if (length >= 0) {
    if (static_cast<size_t>(length) > kMaxReply) throw ConnectionLost{"malformed reply: over 256 MiB"};
    if (!readExactly(static_cast<size_t>(length), &reply.body, deadline)) throw IoTimeout{};
  } else {
    throw ConnectionLost{"malformed reply: neither Content-Length nor chunked"};
  }
  broken_ = closeAfter_;
  return reply;
}

int HttpConnection::startStream(const std::string& path, const std::string& json, Clock::time_point deadline) {
  sendRequest(path, json, deadline);
  streaming_ = true;
  long long length = -1;
  bool chunked = false;
  const int status = readHead(deadline, &length, &chunked);
  if (!chunked) {
    // An error reply comes whole: keep it as the stream's only line.
    std::string body;
    if (length > 0 && static_cast<size_t>(length) <= kMaxReply) {
      if (!readExactly(static_cast<size_t>(length), &body, deadline)) throw IoTimeout{};
    }
    stream_ = body + "\n";
  }
  return status;
}

bool HttpConnection::nextLine(std::string* line, Clock::time_point deadline) {
  size_t end;
  while ((end = stream_.find('\n')) == std::string::npos) {
    if (!readChunk(deadline)) return false;
  }
  line->assign(stream_, 0, end);
  stream_.erase(0, end + 1);
  return true;
}

}  // namespace ddp::etcd
