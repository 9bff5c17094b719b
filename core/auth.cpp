#include "core/auth.hpp"

#include "core/config.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace kernelrl {

namespace {

std::string hex(const unsigned char* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string out(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = digits[p[i] >> 4];
    out[2 * i + 1] = digits[p[i] & 15];
  }
  return out;
}

constexpr size_t min_secret_bytes = 16;

}  // namespace

std::string secret_file_problem(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !(st.st_mode & (S_IRWXG | S_IRWXO))) return "";
  char mode[8];
  std::snprintf(mode, sizeof mode, "%03o", static_cast<unsigned>(st.st_mode & 0777));
  return std::string("a secret readable by group or others (mode ") + mode + "); `chmod 600 " + path + "` it";
}

std::optional<std::string> read_cluster_secret(const ClusterConfig& cluster, std::string& err) {
  std::string secret, from;
  if (!cluster.secret_file.empty()) {
    if (auto why = secret_file_problem(cluster.secret_file); !why.empty()) {
      err = "[cluster] secret_file " + cluster.secret_file + ": " + why;
      return std::nullopt;
    }
    std::ifstream in(cluster.secret_file, std::ios::binary);
    if (!in) {
      err = "[cluster] secret_file " + cluster.secret_file + ": cannot read it";
      return std::nullopt;
    }
    std::ostringstream os;
    os << in.rdbuf();
    secret = os.str();
    from = "[cluster] secret_file " + cluster.secret_file;
  } else if (const char* env = std::getenv("KERNELRL_CLUSTER_SECRET")) {
    secret = env;
    from = "$KERNELRL_CLUSTER_SECRET";
  } else {
    err =
        "this cluster needs a secret: set [cluster] secret_file or $KERNELRL_CLUSTER_SECRET "
        "(e.g. `(umask 077; openssl rand -hex 32 > cluster.secret)`)";
    return std::nullopt;
  }
  while (!secret.empty() && std::isspace(static_cast<unsigned char>(secret.back()))) secret.pop_back();
  if (secret.size() < min_secret_bytes) {
    err = from + ": the secret is " + std::to_string(secret.size()) + " bytes; at least " +
          std::to_string(min_secret_bytes) + " are needed";
    return std::nullopt;
  }
  return secret;
}

std::string random_nonce() {
  unsigned char buf[32];
  if (RAND_bytes(buf, sizeof buf) != 1) std::abort();  // no randomness: nothing safe to do
  return hex(buf, sizeof buf);
}

namespace {
std::string hmac_hex(const std::string& secret, const std::string& msg) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), reinterpret_cast<const unsigned char*>(msg.data()),
       msg.size(), out, &len);
  return hex(out, len);
}
}  // namespace

std::string join_proof(const std::string& secret, const std::string& nonce, const std::string& node,
                       const std::string& cluster, uint32_t protocol) {
  return hmac_hex(secret, "kernelrl-join\n" + nonce + "\n" + node + "\n" + cluster + "\n" + std::to_string(protocol));
}

std::string head_proof(const std::string& secret, const std::string& peer_nonce, const std::string& gate_nonce,
                       const std::string& cluster, uint32_t protocol) {
  return hmac_hex(
      secret, "kernelrl-head\n" + peer_nonce + "\n" + gate_nonce + "\n" + cluster + "\n" + std::to_string(protocol));
}

bool proofs_equal(const std::string& a, const std::string& b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace kernelrl
