// The server side of HTTP/1.1 (core/http_server.hpp) that `launch serve` answers with: requests
// split across reads and pipelined, persistent connections by version and Connection header, and
// every malformed or oversized request refused with its status and reason, not parsed further.
#include "core/http_server.hpp"

#include <catch2/catch.hpp>

#include <string>

using namespace kernelrl;

namespace {

std::string post(const std::string& body, const std::string& extra = "") {
  return "POST /v1/evaluate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n" + extra + "\r\n" + body;
}

}  // namespace

TEST_CASE("a request arriving one byte at a time is parsed once complete", "[http]") {
  HttpRequestParser p;
  const std::string raw = post("{\"task\": \"a\"}");
  HttpServerRequest r;
  for (size_t i = 0; i + 1 < raw.size(); ++i) {
    p.feed(raw.data() + i, 1);
    REQUIRE_FALSE(p.take(r));
    REQUIRE_FALSE(p.failed());
  }
  p.feed(raw.data() + raw.size() - 1, 1);
  REQUIRE(p.take(r));
  CHECK(r.method == "POST");
  CHECK(r.path() == "/v1/evaluate");
  CHECK(r.headers.at("content-type") == "application/json");
  CHECK(r.body == "{\"task\": \"a\"}");
  CHECK(r.keep_alive);
  CHECK(p.buffered() == 0);
}

TEST_CASE("pipelined requests come out in order, each with its own body", "[http]") {
  HttpRequestParser p;
  const std::string raw =
      post("one") + "GET /v1/tasks?x=1 HTTP/1.1\r\nHost: y\r\nConnection: close\r\n\r\n" + post("3");
  p.feed(raw.data(), raw.size());
  HttpServerRequest a, b, c, d;
  REQUIRE(p.take(a));
  REQUIRE(p.take(b));
  REQUIRE(p.take(c));
  CHECK_FALSE(p.take(d));
  CHECK(a.body == "one");
  CHECK(b.method == "GET");
  CHECK(b.path() == "/v1/tasks");
  CHECK(b.target == "/v1/tasks?x=1");
  CHECK_FALSE(b.keep_alive);
  CHECK(c.body == "3");
}

TEST_CASE("HTTP/1.0 closes unless it asks for keep-alive", "[http]") {
  HttpRequestParser p;
  std::string raw = "GET /v1/health HTTP/1.0\r\n\r\nGET /v1/health HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n";
  p.feed(raw.data(), raw.size());
  HttpServerRequest a, b;
  REQUIRE(p.take(a));
  REQUIRE(p.take(b));
  CHECK_FALSE(a.keep_alive);
  CHECK(b.keep_alive);
}

TEST_CASE("Expect: 100-continue asks for a 100 once, before the body", "[http]") {
  HttpRequestParser p;
  std::string head = "POST /v1/evaluate HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n";
  p.feed(head.data(), head.size());
  HttpServerRequest r;
  CHECK_FALSE(p.take(r));
  CHECK(p.take_continue());
  CHECK_FALSE(p.take(r));
  CHECK_FALSE(p.take_continue());
  p.feed("body", 4);
  REQUIRE(p.take(r));
  CHECK(r.body == "body");
}

TEST_CASE("malformed and oversized requests are refused with a status and a reason", "[http]") {
  struct Case {
    std::string raw;
    int status;
    std::string reason;
  };
  HttpLimits small;
  small.max_header_bytes = 256;
  small.max_body_bytes = 10;
  const std::vector<Case> cases = {
      {"hello\r\n\r\n", 400, "malformed request line"},
      {"GET  / HTTP/1.1\r\nHost: x\r\n\r\n", 400, "malformed request line"},
      {"GET v1/health HTTP/1.1\r\nHost: x\r\n\r\n", 400, "the target must be a path"},
      {"GET /v1/health HTTP/2.0\r\nHost: x\r\n\r\n", 505, "HTTP/2.0"},
      {"GET /v1/health FTP/1.1\r\nHost: x\r\n\r\n", 400, "not an HTTP version"},
      {"GET /v1/health HTTP/1.1\r\n\r\n", 400, "Host header"},
      {"GET / HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n", 400, "no colon"},
      {"GET / HTTP/1.1\r\nHost: x\r\nBad Name: 1\r\n\r\n", 400, "malformed header name"},
      {"GET / HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n", 400, "folding"},
      {"GET / HTTP/1.1\r\nHost: x\r\nX: a\nContent-Length: 9\r\n\r\n", 400, "bare CR, LF"},
      {"GET / HTTP/1.1\r\nHost: x\r\nX: a\rb\r\n\r\n", 400, "bare CR, LF"},
      {std::string("GET / HTTP/1.1\r\nHost: x\r\nX: a\0b\r\n\r\n", 35), 400, "NUL"},
      {"GET / HTTP/1.1\nHost: x\n\n", 400, "CRLF"},
      {"GET / HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", 400, "more than one Host"},
      {"POST /v1/evaluate HTTP/1.1\r\nHost: x\r\n\r\n", 411, "Content-Length"},
      {"POST /v1/evaluate HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", 411, "chunked"},
      {"POST /v1/evaluate HTTP/1.1\r\nHost: x\r\nContent-Length: -3\r\n\r\n", 400, "not a number"},
      {"POST /v1/evaluate HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\n", 400, "conflicting"},
      {"POST /v1/evaluate HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\n", 413, "at most 10"},
      {"GET / HTTP/1.1\r\nHost: x\r\nX: " + std::string(300, 'a') + "\r\n\r\n", 431, "exceed 256"},
      {"GET / HTTP/1.1\r\nHost: x\r\nX: " + std::string(300, 'a'), 431, "exceed 256"},  // no end in sight
  };
  for (auto& c : cases) {
    INFO(c.raw.substr(0, 80));
    HttpRequestParser p(small);
    p.feed(c.raw.data(), c.raw.size());
    HttpServerRequest r;
    CHECK_FALSE(p.take(r));
    REQUIRE(p.failed());
    CHECK(p.status() == c.status);
    CHECK_THAT(p.reason(), Catch::Contains(c.reason));
    CHECK_FALSE(p.take(r));  // stays failed: the connection is answered and closed
  }
}

TEST_CASE("a response carries its status line, length and connection", "[http]") {
  std::string r = http_response(405, "{}", false, "application/json", {{"Allow", "POST"}});
  CHECK(r.rfind("HTTP/1.1 405 Method Not Allowed\r\n", 0) == 0);
  CHECK_THAT(r, Catch::Contains("Content-Length: 2\r\n"));
  CHECK_THAT(r, Catch::Contains("Connection: close\r\n"));
  CHECK_THAT(r, Catch::Contains("Allow: POST\r\n"));
  CHECK(r.substr(r.size() - 6) == "\r\n\r\n{}");
}
