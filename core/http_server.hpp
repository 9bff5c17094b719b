// The server side of HTTP/1.1 for `launch serve`: an incremental request parser with limits, and
// the responses. No sockets here (actors/service.cpp owns the connections); pure, unit-tested.
// Supported: request line, headers, a body by Content-Length, persistent connections (HTTP/1.1's
// default; "Connection: close" and HTTP/1.0 without keep-alive close after the answer), pipelined
// requests (parsed one at a time), "Expect: 100-continue". Chunked request bodies are refused (411: send Content-Length).
#pragma once

#include <cstddef>
#include <map>
#include <string>

namespace kernelrl {

struct HttpServerRequest {
  std::string method, target, version;         // "POST", "/v1/evaluate", "HTTP/1.1"
  std::map<std::string, std::string> headers;  // names lower-cased, values trimmed
  std::string body;
  bool keep_alive = true;  // whether the connection stays open after the answer
  // The path part of the target (before '?').
  std::string path() const { return target.substr(0, target.find('?')); }
};

struct HttpLimits {
  size_t max_header_bytes = 16 * 1024;  // request line and headers together
  size_t max_body_bytes = 4 * 1024 * 1024;
};

// Feed bytes as they arrive; after each feed, take() every complete request in order. Once
// failed(), the connection is answered with status() and reason() and closed (the stream cannot
// be resynchronised).
class HttpRequestParser {
 public:
  explicit HttpRequestParser(HttpLimits limits = {}) : limits_(limits) {}
  void feed(const char* data, size_t n) { buf_.append(data, n); }
  // The next complete request, if one is buffered; false when more bytes are needed or on error.
  bool take(HttpServerRequest& out);
  bool failed() const { return status_ != 0; }
  int status() const { return status_; }  // 400, 411, 413, 431, 505, 501 once failed
  const std::string& reason() const { return reason_; }
  size_t buffered() const { return buf_.size(); }
  // True once for a request whose head asked "Expect: 100-continue" and whose body has not
  // arrived: the server answers "100 Continue" so that the client sends it (curl waits for it).
  bool take_continue() {
    bool due = continue_due_;
    continue_due_ = false;
    return due;
  }

 private:
  bool fail(int status, std::string reason);
  HttpLimits limits_;
  std::string buf_;
  int status_ = 0;
  std::string reason_;
  bool continue_due_ = false, continue_sent_ = false;
};

// "Bad Request" for 400, ... ("Unknown" for codes not listed).
const char* http_reason_phrase(int status);

// A complete response: status line, Content-Type, Content-Length, Connection, extra headers
// (e.g. {"Allow", "POST"}), then the body.
std::string http_response(int status, const std::string& body, bool keep_alive,
                          const std::string& content_type = "application/json",
                          const std::map<std::string, std::string>& extra_headers = {});

}  // namespace kernelrl
