#include "core/http.hpp"

#include <arpa/inet.h>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

namespace kernelrl {

bool parse_http_url(const std::string& url, std::string& host, uint16_t& port, std::string& base_path,
                    std::string& err) {
  const std::string scheme = "http://";
  if (url.rfind("https://", 0) == 0) {
    err = url + ": https is not supported; reach the server over http (or through a TLS proxy)";
    return false;
  }
  if (url.rfind(scheme, 0) != 0) {
    err = url + ": expected http://HOST:PORT[/PATH]";
    return false;
  }
  std::string rest = url.substr(scheme.size());
  auto slash = rest.find('/');
  std::string hp = rest.substr(0, slash);
  base_path = slash == std::string::npos ? "" : rest.substr(slash);
  while (!base_path.empty() && base_path.back() == '/') base_path.pop_back();
  auto colon = hp.rfind(':');
  host = colon == std::string::npos ? hp : hp.substr(0, colon);
  port = 80;
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

using clock_t_ = std::chrono::steady_clock;

int remaining_ms(clock_t_::time_point deadline) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_t_::now()).count();
  return ms < 0 ? 0 : static_cast<int>(ms);
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Decodes a chunked body; false if it is incomplete.
bool dechunk(const std::string& in, std::string& out) {
  out.clear();
  size_t i = 0;
  while (true) {
    auto eol = in.find("\r\n", i);
    if (eol == std::string::npos) return false;
    size_t n = std::stoul(in.substr(i, eol - i), nullptr, 16);
    i = eol + 2;
    if (n == 0) return true;
    if (in.size() < i + n + 2) return false;
    out.append(in, i, n);
    i += n + 2;
  }
}

}  // namespace

HttpResponse http_request(const std::string& method, const std::string& url, const std::string& body,
                          const std::map<std::string, std::string>& headers, double timeout_s) {
  HttpResponse r;
  std::string host, path, err;
  uint16_t port = 0;
  if (!parse_http_url(url, host, port, path, err)) {
    r.error = err;
    return r;
  }
  if (path.empty()) path = "/";
  auto deadline = clock_t_::now() + std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0) {
    r.error = "cannot resolve " + host + ": " + gai_strerror(rc);
    return r;
  }
  Fd s;
  std::string last = "no address";
  for (auto* a = res; a; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    int rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, remaining_ms(deadline)) == 1) {
        int so = 0;
        socklen_t len = sizeof so;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &so, &len);
        rc = so == 0 ? 0 : -1;
        errno = so;
      } else {
        errno = ETIMEDOUT;
      }
    }
    if (rc == 0) {
      s.fd = fd;
      break;
    }
    last = std::strerror(errno);
    ::close(fd);
  }
  freeaddrinfo(res);
  if (s.fd < 0) {
    r.error = "cannot connect to " + host + ":" + std::to_string(port) + ": " + last;
    return r;
  }
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: " + host + ":" + std::to_string(port) +
                    "\r\nConnection: close\r\nAccept: application/json\r\n";
  if (!body.empty()) req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  for (auto& [k, v] : headers) req += k + ": " + v + "\r\n";
  req += "\r\n" + body;
  for (size_t sent = 0; sent < req.size();) {
    pollfd p{s.fd, POLLOUT, 0};
    if (::poll(&p, 1, remaining_ms(deadline)) != 1) {
      r.error = "timed out after " + std::to_string(timeout_s) + " s sending the request";
      return r;
    }
    ssize_t n = ::send(s.fd, req.data() + sent, req.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno != EAGAIN && errno != EINTR) {
      r.error = std::string("send failed: ") + std::strerror(errno);
      return r;
    }
    if (n > 0) sent += n;
  }
  std::string in;
  size_t header_end = std::string::npos, content_length = std::string::npos;
  bool chunked = false;
  char buf[65536];
  while (true) {
    if (header_end != std::string::npos) {
      std::string payload = in.substr(header_end);
      if (content_length != std::string::npos && payload.size() >= content_length) {
        r.body = payload.substr(0, content_length);
        return r;
      }
      if (chunked && dechunk(payload, r.body)) return r;
    }
    pollfd p{s.fd, POLLIN, 0};
    int pr = ::poll(&p, 1, remaining_ms(deadline));
    if (pr == 0) {
      r = HttpResponse{};
      r.error = "timed out after " + std::to_string(timeout_s).substr(0, std::to_string(timeout_s).find('.') + 2) +
                " s waiting for the response";
      return r;
    }
    ssize_t n = ::recv(s.fd, buf, sizeof buf, 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n <= 0) {  // the server closed the connection
      if (header_end == std::string::npos) {
        r.error = "the connection closed before a complete response";
        return r;
      }
      if (chunked || (content_length != std::string::npos)) {
        r = HttpResponse{};
        r.error = "the connection closed in the middle of the response body";
        return r;
      }
      r.body = in.substr(header_end);
      return r;
    }
    in.append(buf, n);
    if (header_end == std::string::npos) {
      auto e = in.find("\r\n\r\n");
      if (e == std::string::npos) continue;
      header_end = e + 4;
      std::string head = in.substr(0, e);
      if (head.rfind("HTTP/1.", 0) != 0 || head.size() < 12) {
        r.error = "not an HTTP response";
        return r;
      }
      r.status = std::atoi(head.c_str() + 9);
      std::string lower = head;
      for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      auto cl = lower.find("\r\ncontent-length:");
      if (cl != std::string::npos) content_length = std::stoul(lower.substr(cl + 17));
      chunked = lower.find("\r\ntransfer-encoding: chunked") != std::string::npos;
    }
  }
}

}  // namespace kernelrl
