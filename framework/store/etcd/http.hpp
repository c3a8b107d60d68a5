// HttpConnection: HTTP/1.1 POSTs of JSON over one kept-alive TCP connection,
// the little of HTTP that etcd's JSON gateway needs (etcd_store.hpp).
//
// Contract
// - Nothing here throws StoreError: a deadline that passes throws
//   tcpstore::IoTimeout, a refused or broken connection throws
//   tcpstore::ConnectionLost with the reason, and a reply that is not HTTP
//   throws ConnectionLost too ("malformed reply: ..."). Callers word the
//   message, naming the store.
// - `post` sends one request and reads its whole reply (Content-Length or
//   chunked); the connection is then ready for the next one.
// - `startStream` sends one request and leaves its chunked reply open:
//   `nextLine` returns the reply's body one line at a time (etcd's gateway
//   writes one JSON message per line), as they arrive, until the deadline.
//   A connection that streamed is closed with the object, never reused.
// - One thread at a time per object.
#pragma once

#include <cstdint>
#include <string>

#include "framework/store/tcp/socket.hpp"

namespace ddp::etcd {

using tcpstore::Clock;

struct HttpReply {
  int status = 0;
  std::string body;
};

class HttpConnection {
 public:
  // Connects to host:port by `deadline`; throws ConnectionLost with the reason.
  HttpConnection(const std::string& host, uint16_t port, Clock::time_point deadline);
  ~HttpConnection();
  HttpConnection(const HttpConnection&) = delete;
  HttpConnection& operator=(const HttpConnection&) = delete;

  HttpReply post(const std::string& path, const std::string& json, Clock::time_point deadline);

  // The status of the streamed reply (its body is read through nextLine).
  int startStream(const std::string& path, const std::string& json, Clock::time_point deadline);
  // The next line of the streamed body, without its "\n"; false once the
  // deadline passes first. Throws ConnectionLost when the stream ends.
  bool nextLine(std::string* line, Clock::time_point deadline);

  // False after an error or a stream: the connection must not be reused.
  bool reusable() const { return fd_ >= 0 && !streaming_ && !broken_; }
  // Reusable, and the server has neither closed it nor sent anything
  // unasked since the last reply (checked without blocking).
  bool idleAndOpen() const;
  std::string endpoint() const { return endpoint_; }

 private:
  void sendRequest(const std::string& path, const std::string& json, Clock::time_point deadline);
  int readHead(Clock::time_point deadline, long long* contentLength, bool* chunked);
  // Reads more bytes into in_; false when the deadline passes first.
  bool fill(Clock::time_point deadline);
  bool readLine(std::string* line, Clock::time_point deadline);  // CRLF-terminated, from in_
  bool readExactly(size_t n, std::string* out, Clock::time_point deadline);
  // The next chunk of a chunked body into stream_; false at its deadline.
  bool readChunk(Clock::time_point deadline);

  std::string host_;
  std::string endpoint_;
  int fd_ = -1;
  std::string in_;      // received, not yet consumed
  std::string stream_;  // decoded body of a stream, not yet returned as lines
  bool streaming_ = false;
  bool broken_ = false;
  bool closeAfter_ = false;  // the server said Connection: close
};

}  // namespace ddp::etcd
