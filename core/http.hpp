// The HTTP client for OpenAI-compatible inference servers (vLLM, SGLang), on libcurl: http:// and
// https:// (the system's CA certificates, or the bundle $CURL_CA_BUNDLE names), proxies from the
// environment (http_proxy, https_proxy, no_proxy), connections kept alive per thread, a
// wall-clock limit for the whole exchange.
#pragma once

#include <map>
#include <string>

namespace kernelrl {

struct HttpResponse {
  int status = 0;  // 0: no response (error says why)
  std::string body;
  std::string error;  // connect/timeout/protocol failure; empty when a response arrived
};

// Splits "http[s]://host[:port]/base" into its parts; false (and `err`) for anything else.
bool parse_http_url(const std::string& url, std::string& host, uint16_t& port, std::string& base_path,
                    std::string& err);

// METHOD url with `body` (sent as application/json when non-empty) and extra headers.
HttpResponse http_request(const std::string& method, const std::string& url, const std::string& body,
                          const std::map<std::string, std::string>& headers, double timeout_s);

}  // namespace kernelrl
