// Cluster authentication: a shared secret that peers prove without sending it.
// The head hands a joining node a fresh random nonce; the node answers with
// HMAC-SHA256(secret, nonce | node name | cluster name | protocol); the head compares in constant
// time. The secret itself never crosses the network, and never reaches a log or the store.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace kernelrl {

struct ClusterConfig;

// The cluster secret: [cluster] secret_file's contents (trailing whitespace dropped), else
// $KERNELRL_CLUSTER_SECRET. nullopt with `err` set when neither gives one, or it is too short.
std::optional<std::string> read_cluster_secret(const ClusterConfig& cluster, std::string& err);

// "" or why a secret file may not be used: readable (or writable) by its group or others, who
// may include the candidates a worker runs (what `openssl rand -hex 32 > FILE` makes under the
// usual umask, 0644). tls_key and publish_key are held to the same rule.
std::string secret_file_problem(const std::string& path);

// 32 random bytes (OpenSSL's CSPRNG), hex.
std::string random_nonce();

// Hex HMAC-SHA256 of the handshake fields under `secret`.
std::string join_proof(const std::string& secret, const std::string& nonce, const std::string& node,
                       const std::string& cluster, uint32_t protocol);

// The head's proof to a joining peer (its answer to the peer's own nonce, so a peer never works
// for a head that does not hold the secret): hex HMAC-SHA256, distinct from any join_proof.
std::string head_proof(const std::string& secret, const std::string& peer_nonce, const std::string& gate_nonce,
                       const std::string& cluster, uint32_t protocol);

// Constant-time comparison of two proofs.
bool proofs_equal(const std::string& a, const std::string& b);

}  // namespace kernelrl
