#include "core/files.hpp"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <vector>

namespace fs = std::filesystem;

namespace kernelrl {

namespace {

std::string errno_text(int e) { return std::strerror(e); }

// SHA-256 of a file as hex, or "" (with `err`) when it cannot be read.
std::string sha256_file(const std::string& path, std::string& err) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) {
    err = path + ": " + errno_text(errno);
    return "";
  }
  Sha256 h;
  std::vector<char> buf(1 << 20);
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) h.add(buf.data(), n);
  const bool failed = std::ferror(f);
  std::fclose(f);
  std::string out = h.hex();
  if (failed) {
    err = path + ": read error";
    return "";
  }
  return out;
}

}  // namespace

bool inject_enospc(const std::string& path) {
  static std::mutex mu;
  static int seen = 0;
  const char* spec = std::getenv("KERNELRL_INJECT_ENOSPC");
  if (!spec || !*spec) return false;
  std::string s = spec, target = s;
  int nth = 0;  // 0: every write
  if (auto colon = s.rfind(':'); colon != std::string::npos) {
    target = s.substr(0, colon);
    nth = std::atoi(s.c_str() + colon + 1);
  }
  const bool match = path == target || (path.size() > target.size() && path.ends_with(target) &&
                                        path[path.size() - target.size() - 1] == '/');
  if (!match) return false;
  std::lock_guard<std::mutex> lock(mu);
  ++seen;
  return nth == 0 || seen == nth;
}

bool sync_path(const std::string& path, std::string& err) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    err = path + ": " + errno_text(errno);
    return false;
  }
  const bool ok = ::fsync(fd) == 0 || errno == EINVAL;  // some file systems cannot sync a folder
  const int e = errno;
  ::close(fd);
  if (!ok) err = path + ": cannot flush to disk: " + errno_text(e);
  return ok;
}

bool write_file_durably(const std::string& path, const std::string& data, std::string& err, unsigned mode) {
  const std::string tmp = path + ".tmp";
  const std::string& name = path;
  ::unlink(tmp.c_str());  // created afresh, so `mode` holds (O_CREAT keeps an old file's)
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode_t(mode));
  if (fd < 0) {
    err = tmp + ": cannot create: " + errno_text(errno);
    return false;
  }
  size_t done = 0;
  int e = 0;
  while (done < data.size()) {
    ssize_t n = inject_enospc(name) ? (errno = ENOSPC, -1) : ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      e = errno;
      break;
    }
    done += size_t(n);
  }
  if (e == 0 && data.empty() && inject_enospc(name)) e = ENOSPC;
  if (e == 0 && ::fsync(fd) != 0) e = errno;
  if (::close(fd) != 0 && e == 0) e = errno;
  if (e != 0) {
    ::unlink(tmp.c_str());
    err = path + ": cannot write: " + errno_text(e);
    return false;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    e = errno;
    ::unlink(tmp.c_str());
    err = path + ": cannot rename into place: " + errno_text(e);
    return false;
  }
  std::string parent = fs::path(path).parent_path().string();
  return sync_path(parent.empty() ? "." : parent, err);
}

bool write_manifest(const std::string& dir, std::string& err) {
  nlohmann::json files = nlohmann::json::object();
  std::error_code ec;
  for (auto& e : fs::directory_iterator(dir, ec)) {
    if (!e.is_regular_file()) continue;
    const std::string name = e.path().filename().string();
    if (name == "manifest.json") continue;
    if (!sync_path(e.path().string(), err)) return false;
    std::string hash = sha256_file(e.path().string(), err);
    if (hash.empty()) return false;
    files[name] = {{"size", uint64_t(e.file_size())}, {"sha256", hash}};
  }
  if (ec) {
    err = dir + ": " + ec.message();
    return false;
  }
  return write_file_durably((fs::path(dir) / "manifest.json").string(), nlohmann::json{{"files", files}}.dump(2) + "\n",
                            err);
}

bool verify_manifest(const std::string& dir, bool hashes, std::string& why) {
  nlohmann::json m;
  try {
    std::ifstream in(fs::path(dir) / "manifest.json");
    if (!in) {
      why = "no manifest.json (the checkpoint was never completed)";
      return false;
    }
    in >> m;
    for (auto& [name, f] : m.at("files").items()) {
      const fs::path p = fs::path(dir) / name;
      std::error_code ec;
      const auto size = fs::file_size(p, ec);
      if (ec) {
        why = name + ": missing";
        return false;
      }
      if (size != f.at("size").get<uint64_t>()) {
        why = name + ": " + std::to_string(size) + " bytes, the manifest says " +
              std::to_string(f.at("size").get<uint64_t>());
        return false;
      }
      if (hashes) {
        std::string err;
        if (sha256_file(p.string(), err) != f.at("sha256").get<std::string>()) {
          why = name + ": its contents changed since the manifest was written" + (err.empty() ? "" : " (" + err + ")");
          return false;
        }
      }
    }
  } catch (const std::exception& e) {
    why = std::string("unreadable manifest.json: ") + e.what();
    return false;
  }
  return true;
}

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) { EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(ctx_), EVP_sha256(), nullptr); }

Sha256::~Sha256() { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_)); }

Sha256& Sha256::add(const void* data, size_t n) {
  EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), data, n);
  return *this;
}

Sha256& Sha256::add_u64(uint64_t v) {
  unsigned char b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>(v >> (8 * i));
  return add(b, 8);
}

Sha256& Sha256::add_sized(const std::string& s) { return add_u64(s.size()).add(s.data(), s.size()); }

std::string Sha256::hex() {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), md, &len);
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < len; ++i) {
    out.push_back(digits[md[i] >> 4]);
    out.push_back(digits[md[i] & 15]);
  }
  return out;
}

}  // namespace kernelrl
