#include "core/http_server.hpp"

#include <algorithm>
#include <cctype>
#include <string_view>
#include <utility>

namespace kernelrl {

namespace {

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t");
  return s.substr(b, e - b + 1);
}

// RFC 9110 token characters (method and header names).
bool is_token(const std::string& s) {
  if (s.empty()) return false;
  for (unsigned char c : s)
    if (!(std::isalnum(c) || std::string_view("!#$%&'*+-.^_`|~").find(static_cast<char>(c)) != std::string::npos))
      return false;
  return true;
}

bool has_token(const std::string& list, const std::string& token) {  // "keep-alive, Upgrade" has "upgrade"
  std::string l = lower(list);
  size_t pos = 0;
  while (pos <= l.size()) {
    size_t comma = l.find(',', pos);
    if (trim(l.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos)) == token) return true;
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return false;
}

}  // namespace

bool HttpRequestParser::fail(int status, std::string reason) {
  status_ = status;
  reason_ = std::move(reason);
  buf_.clear();
  return false;
}

bool HttpRequestParser::take(HttpServerRequest& out) {
  if (failed()) return false;
  // Blank lines before a request line are ignored (RFC 9112 2.2).
  size_t lead = 0;
  while (lead + 1 < buf_.size() && buf_[lead] == '\r' && buf_[lead + 1] == '\n') lead += 2;
  if (lead) buf_.erase(0, lead);
  const size_t head_end = buf_.find("\r\n\r\n");
  if (head_end == std::string::npos) {
    if (buf_.find("\n\n") != std::string::npos) return fail(400, "lines must end with CRLF (\\r\\n), not a bare LF");
    if (buf_.size() > limits_.max_header_bytes)
      return fail(431, "the request line and headers exceed " + std::to_string(limits_.max_header_bytes) + " bytes");
    return false;
  }
  if (head_end + 4 > limits_.max_header_bytes)
    return fail(431, "the request line and headers exceed " + std::to_string(limits_.max_header_bytes) + " bytes");
  HttpServerRequest r;
  const std::string head = buf_.substr(0, head_end);
  // A bare CR or LF, or a NUL, inside the head: two parsers (a proxy's and this one) could split it
  // differently, so it is refused rather than guessed at.
  for (size_t i = 0; i < head.size(); ++i) {
    const char c = head[i];
    if (c == '\0' || (c == '\r' && (i + 1 >= head.size() || head[i + 1] != '\n')) ||
        (c == '\n' && (i == 0 || head[i - 1] != '\r')))
      return fail(400, "a bare CR, LF or NUL in the request line or headers");
  }
  size_t line_end = head.find("\r\n");
  const std::string request_line = head.substr(0, line_end);
  {
    size_t a = request_line.find(' ');
    size_t b = a == std::string::npos ? a : request_line.find(' ', a + 1);
    if (a == std::string::npos || b == std::string::npos || request_line.find(' ', b + 1) != std::string::npos)
      return fail(400, "malformed request line (expected METHOD TARGET HTTP/1.1)");
    r.method = request_line.substr(0, a);
    r.target = request_line.substr(a + 1, b - a - 1);
    r.version = request_line.substr(b + 1);
    if (!is_token(r.method)) return fail(400, "malformed request line: bad method");
    if (r.target.empty() || (r.target[0] != '/' && r.target != "*"))
      return fail(400, "malformed request line: the target must be a path starting with /");
    if (r.version.rfind("HTTP/", 0) != 0) return fail(400, "malformed request line: not an HTTP version");
    if (r.version != "HTTP/1.1" && r.version != "HTTP/1.0")
      return fail(505, "HTTP version " + r.version + " is not supported (HTTP/1.1 or HTTP/1.0)");
  }
  while (line_end != std::string::npos) {
    size_t start = line_end + 2;
    line_end = head.find("\r\n", start);
    std::string line = head.substr(start, line_end == std::string::npos ? std::string::npos : line_end - start);
    if (line.empty()) continue;
    if (line[0] == ' ' || line[0] == '\t') return fail(400, "obsolete header line folding is not accepted");
    size_t colon = line.find(':');
    if (colon == std::string::npos) return fail(400, "malformed header line (no colon): " + line.substr(0, 80));
    std::string name = line.substr(0, colon);
    if (!is_token(name)) return fail(400, "malformed header name: " + name.substr(0, 80));
    name = lower(name);
    std::string value = trim(line.substr(colon + 1));
    if (name == "content-length" && r.headers.count(name) && r.headers[name] != value)
      return fail(400, "conflicting Content-Length headers");
    if (name == "host" && r.headers.count(name)) return fail(400, "more than one Host header");
    auto [it, fresh] = r.headers.emplace(name, value);
    if (!fresh && name != "content-length") it->second += ", " + value;
  }
  if (r.version == "HTTP/1.1" && !r.headers.count("host")) return fail(400, "an HTTP/1.1 request needs a Host header");
  if (auto te = r.headers.find("transfer-encoding"); te != r.headers.end())
    return fail(411, "Transfer-Encoding " + te->second + " is not accepted: send the body with a Content-Length");
  size_t length = 0;
  if (auto cl = r.headers.find("content-length"); cl != r.headers.end()) {
    const std::string& v = cl->second;
    if (v.empty() || v.size() > 15 || !std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return fail(400, "Content-Length is not a number: " + v.substr(0, 40));
    length = std::stoull(v);
    if (length > limits_.max_body_bytes)
      return fail(413,
                  "the body is " + v + " bytes; at most " + std::to_string(limits_.max_body_bytes) + " are accepted");
  } else if (r.method == "POST" || r.method == "PUT" || r.method == "PATCH") {
    return fail(411, r.method + " needs a Content-Length header");
  }
  if (buf_.size() < head_end + 4 + length) {  // the body is still arriving
    if (!continue_sent_ && r.version == "HTTP/1.1")
      if (auto ex = r.headers.find("expect"); ex != r.headers.end() && has_token(ex->second, "100-continue"))
        continue_due_ = continue_sent_ = true;
    return false;
  }
  continue_sent_ = false;
  r.body = buf_.substr(head_end + 4, length);
  buf_.erase(0, head_end + 4 + length);
  auto conn = r.headers.find("connection");
  if (r.version == "HTTP/1.0")
    r.keep_alive = conn != r.headers.end() && has_token(conn->second, "keep-alive");
  else
    r.keep_alive = conn == r.headers.end() || !has_token(conn->second, "close");
  out = std::move(r);
  return true;
}

const char* http_reason_phrase(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 411:
      return "Length Required";
    case 413:
      return "Content Too Large";
    case 415:
      return "Unsupported Media Type";
    case 422:
      return "Unprocessable Content";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 503:
      return "Service Unavailable";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return "Unknown";
  }
}

std::string http_response(int status, const std::string& body, bool keep_alive, const std::string& content_type,
                          const std::map<std::string, std::string>& extra_headers) {
  std::string out = "HTTP/1.1 " + std::to_string(status) + " " + http_reason_phrase(status) + "\r\n";
  out += "Content-Type: " + content_type + "\r\n";
  out += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  out += keep_alive ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
  for (auto& [k, v] : extra_headers) out += k + ": " + v + "\r\n";
  out += "\r\n";
  out += body;
  return out;
}

}  // namespace kernelrl
