// A small HTTP/1.1 client for OpenAI-compatible inference servers (vLLM, SGLang) on the
// cluster's network: plain http:// only (put TLS in front with a proxy), one request per
// connection, Content-Length or chunked bodies, a wall-clock limit for the whole exchange.
#pragma once

#include <map>
#include <string>

namespace kernelrl {

struct HttpResponse {
  int status = 0;  // 0: no response (error says why)
  std::string body;
  std::string error;  // connect/timeout/protocol failure; empty when a response arrived
};

// Splits "http://host:port/base" into its parts; false (and `err`) for anything else.
bool parse_http_url(const std::string& url, std::string& host, uint16_t& port, std::string& base_path,
                    std::string& err);

// METHOD url with `body` (sent as application/json when non-empty) and extra headers.
HttpResponse http_request(const std::string& method, const std::string& url, const std::string& body,
                          const std::map<std::string, std::string>& headers, double timeout_s);

}  // namespace kernelrl
