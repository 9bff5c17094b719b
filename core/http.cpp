#include "core/http.hpp"

#include <curl/curl.h>

#include <cstdlib>
#include <memory>
#include <mutex>

namespace kernelrl {

bool parse_http_url(const std::string& url, std::string& host, uint16_t& port, std::string& base_path,
                    std::string& err) {
  const bool tls = url.rfind("https://", 0) == 0;
  if (!tls && url.rfind("http://", 0) != 0) {
    err = url + ": expected http://HOST[:PORT][/PATH] or https://HOST[:PORT][/PATH]";
    return false;
  }
  std::string rest = url.substr(tls ? 8 : 7);
  auto slash = rest.find('/');
  std::string hp = rest.substr(0, slash);
  base_path = slash == std::string::npos ? "" : rest.substr(slash);
  while (!base_path.empty() && base_path.back() == '/') base_path.pop_back();
  auto colon = hp.rfind(':');
  host = colon == std::string::npos ? hp : hp.substr(0, colon);
  port = tls ? 443 : 80;
  if (colon != std::string::npos) {
    try {
      size_t used = 0;
      long p = std::stol(hp.substr(colon + 1), &used);
      if (used != hp.size() - colon - 1 || p < 1 || p > 65535) throw std::invalid_argument("port");
      port = static_cast<uint16_t>(p);
    } catch (const std::exception&) {
      err = url + ": the port is not a number from 1 to 65535";
      return false;
    }
  }
  if (host.empty()) {
    err = url + ": no host";
    return false;
  }
  return true;
}

namespace {

size_t append_body(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

struct CurlDeleter {
  void operator()(CURL* h) const { curl_easy_cleanup(h); }
};

// One handle per thread, reset between requests: libcurl keeps its connections (keep-alive), DNS
// and TLS sessions across resets.
CURL* thread_handle() {
  static std::once_flag init;
  std::call_once(init, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  thread_local std::unique_ptr<CURL, CurlDeleter> handle(curl_easy_init());
  if (handle) curl_easy_reset(handle.get());
  return handle.get();
}

std::string describe(CURLcode rc, const char* detail, double timeout_s) {
  std::string why = detail[0] ? detail : curl_easy_strerror(rc);
  switch (rc) {
    case CURLE_COULDNT_CONNECT:
      return "cannot connect (" + why + ")";
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
      return "cannot resolve the host (" + why + ")";
    case CURLE_OPERATION_TIMEDOUT:
      return "no complete answer within " + std::to_string(timeout_s) + " s (" + why + ")";
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_PEER_FAILED_VERIFICATION:
      return "TLS failed (" + why + ")";
    default:
      return why;
  }
}

}  // namespace

HttpResponse http_request(const std::string& method, const std::string& url, const std::string& body,
                          const std::map<std::string, std::string>& headers, double timeout_s) {
  HttpResponse res;
  CURL* h = thread_handle();
  if (!h) {
    res.error = "cannot create an HTTP handle (libcurl)";
    return res;
  }
  char detail[CURL_ERROR_SIZE] = {0};
  curl_slist* list = nullptr;
  if (!body.empty()) list = curl_slist_append(list, "Content-Type: application/json");
  list = curl_slist_append(list, "Expect:");  // no 100-continue round trip before a large body
  for (auto& [k, v] : headers) list = curl_slist_append(list, (k + ": " + v).c_str());
  const long ms = std::max(1L, static_cast<long>(timeout_s * 1000));
  curl_easy_setopt(h, CURLOPT_URL, url.c_str());
  curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method.c_str());
  if (!body.empty() || method == "POST") {
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body.data());
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  }
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, list);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, append_body);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &res.body);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, detail);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, ms);  // the whole exchange
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, ms);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);  // threads: no SIGALRM for DNS timeouts
  curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(h, CURLOPT_ACCEPT_ENCODING, "");  // whatever the server compresses with
  // Proxies come from the environment (http_proxy, https_proxy, no_proxy), as curl's own; so does
  // another CA bundle (CURL_CA_BUNDLE, as the curl tool reads it), e.g. a cluster's own CA.
  if (const char* ca = std::getenv("CURL_CA_BUNDLE"); ca && *ca) curl_easy_setopt(h, CURLOPT_CAINFO, ca);
  CURLcode rc = curl_easy_perform(h);
  curl_slist_free_all(list);
  if (rc != CURLE_OK) {
    res.error = describe(rc, detail, timeout_s);
    res.body.clear();
    return res;
  }
  long status = 0;
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
  res.status = static_cast<int>(status);
  return res;
}

}  // namespace kernelrl
