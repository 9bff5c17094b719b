// ZeroMQ CURVE keys for the telemetry socket: the publisher's secret key and the public keys of
// the readers it lets in (checked by a ZAP handler), each a Z85 string of 40 characters.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace kernelrl {

// Whether this libzmq was built with CURVE.
bool curve_available();

// The key in a key file: the first word of its first line that is neither blank nor a '#'
// comment, 40 Z85 characters. A secret key file must not be readable by group or others. nullopt and `err`
// (naming the file) otherwise.
std::optional<std::string> read_curve_key(const std::string& file, bool secret, std::string& err);

// Every key in an authorized-keys file (one per line, a '#' comment may follow it; at least one).
std::optional<std::vector<std::string>> read_curve_clients(const std::string& file, std::string& err);

// A new key pair (Z85): {public, secret}.
std::pair<std::string, std::string> curve_keypair();

// The public key of a Z85 secret key.
std::string curve_public_of(const std::string& secret_z85);

}  // namespace kernelrl
