// Mutual TLS between a cluster's nodes (CAF's OpenSSL transport): every peer presents a
// certificate signed by the cluster's CA and accepts only peers whose certificate verifies
// against it. These checks run when the config is read, so a wrong file is a located error
// there, not a failed handshake later.
#pragma once

#include <string>

namespace kernelrl {

struct TlsFiles {
  std::string cert;  // this machine's certificate (PEM; a chain may follow it)
  std::string key;   // its private key (PEM, unencrypted, readable by its owner only)
  std::string ca;    // the cluster CA's certificate(s) (PEM) that every peer's must verify against
};

// "" when the three files make a usable identity: the certificate and key read, the key is the
// certificate's, the key is not readable by group or others, and the certificate verifies against
// the CA now (signature, dates). Otherwise what is wrong, naming the file.
std::string tls_problem(const TlsFiles& f);

// One line for logs: the certificate's subject and its expiry ("CN=node-a, until 2027-11-25").
std::string tls_identity(const std::string& cert_file);

}  // namespace kernelrl
