#include "core/tls.hpp"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include <sys/stat.h>

#include <cstdio>
#include <ctime>
#include <memory>

namespace kernelrl {

namespace {

std::string last_ssl_error() {
  std::string msg;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    msg = buf;  // the last is the most specific
  }
  return msg.empty() ? "unknown OpenSSL error" : msg;
}

template <class T, void (*Free)(T*)>
struct Deleter {
  void operator()(T* p) const { Free(p); }
};
using CertPtr = std::unique_ptr<X509, Deleter<X509, X509_free>>;
using KeyPtr = std::unique_ptr<EVP_PKEY, Deleter<EVP_PKEY, EVP_PKEY_free>>;
using CtxPtr = std::unique_ptr<SSL_CTX, Deleter<SSL_CTX, SSL_CTX_free>>;
using StoreCtxPtr = std::unique_ptr<X509_STORE_CTX, Deleter<X509_STORE_CTX, X509_STORE_CTX_free>>;

CertPtr read_cert(const std::string& file) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(file.c_str(), "r"), std::fclose);
  if (!f) return nullptr;
  return CertPtr(PEM_read_X509(f.get(), nullptr, nullptr, nullptr));
}

}  // namespace

std::string tls_problem(const TlsFiles& f) {
  ERR_clear_error();
  CtxPtr ctx(SSL_CTX_new(TLS_method()));
  if (!ctx) return "cannot create an OpenSSL context: " + last_ssl_error();
  if (SSL_CTX_use_certificate_chain_file(ctx.get(), f.cert.c_str()) != 1)
    return "tls_cert " + f.cert + ": not a PEM certificate (" + last_ssl_error() + ")";
  struct stat st {};
  if (::stat(f.key.c_str(), &st) == 0 && (st.st_mode & (S_IRWXG | S_IRWXO)))
    return "tls_key " + f.key + ": readable by group or others (mode " + std::to_string((st.st_mode >> 6) & 7) +
           std::to_string((st.st_mode >> 3) & 7) + std::to_string(st.st_mode & 7) + "); `chmod 600` it";
  KeyPtr key;
  {
    std::unique_ptr<FILE, int (*)(FILE*)> kf(std::fopen(f.key.c_str(), "r"), std::fclose);
    // No passphrase callback: an encrypted key fails here rather than prompting on a terminal.
    if (kf)
      key.reset(PEM_read_PrivateKey(
          kf.get(), nullptr, [](char*, int, int, void*) { return 0; }, nullptr));
  }
  if (!key) return "tls_key " + f.key + ": not an unencrypted PEM private key (" + last_ssl_error() + ")";
  if (X509_check_private_key(SSL_CTX_get0_certificate(ctx.get()), key.get()) != 1 ||
      SSL_CTX_use_PrivateKey(ctx.get(), key.get()) != 1) {
    ERR_clear_error();
    return "tls_key " + f.key + ": not the key of the certificate in " + f.cert;
  }
  if (SSL_CTX_load_verify_locations(ctx.get(), f.ca.c_str(), nullptr) != 1)
    return "tls_ca " + f.ca + ": no PEM CA certificate in it (" + last_ssl_error() + ")";
  X509* cert = SSL_CTX_get0_certificate(ctx.get());
  STACK_OF(X509)* chain = nullptr;
  SSL_CTX_get0_chain_certs(ctx.get(), &chain);
  StoreCtxPtr vctx(X509_STORE_CTX_new());
  if (!vctx || X509_STORE_CTX_init(vctx.get(), SSL_CTX_get_cert_store(ctx.get()), cert, chain) != 1)
    return "cannot set up certificate verification: " + last_ssl_error();
  if (X509_verify_cert(vctx.get()) != 1)
    return "tls_cert " + f.cert + " does not verify against the CA in " + f.ca + ": " +
           X509_verify_cert_error_string(X509_STORE_CTX_get_error(vctx.get()));
  return "";
}

std::string tls_identity(const std::string& cert_file) {
  CertPtr c = read_cert(cert_file);
  if (!c) return cert_file;
  char subject[512] = {0};
  X509_NAME_oneline(X509_get_subject_name(c.get()), subject, sizeof subject - 1);
  std::string out = subject;
  struct tm until {};
  if (ASN1_TIME_to_tm(X509_get0_notAfter(c.get()), &until) == 1) {
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%d", &until);
    out += std::string(", valid until ") + buf;
  }
  return out;
}

}  // namespace kernelrl
