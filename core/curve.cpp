#include "core/curve.hpp"

#include <zmq.h>

#include <sys/stat.h>

#include <cstring>
#include <fstream>
#include <stdexcept>

namespace kernelrl {

namespace {

bool is_z85_key(const std::string& s) {
  if (s.size() != 40) return false;
  uint8_t raw[32];
  return zmq_z85_decode(raw, s.c_str()) != nullptr;
}

// A line's key: its first word when that is a Z85 key (a comment after it is allowed). Z85 has
// '#' among its characters, so a comment is a line whose first word is not a key and starts with
// '#'. "" for a blank or comment line; nullopt for anything else.
std::optional<std::string> key_on_line(const std::string& line) {
  const auto b = line.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  const auto e = line.find_first_of(" \t\r", b);
  const std::string word = line.substr(b, e == std::string::npos ? std::string::npos : e - b);
  const auto rest = e == std::string::npos ? std::string::npos : line.find_first_not_of(" \t\r", e);
  if (is_z85_key(word) && (rest == std::string::npos || line[rest] == '#')) return word;
  if (line[b] == '#') return "";
  return std::nullopt;
}

}  // namespace

bool curve_available() { return zmq_has("curve") == 1; }

std::optional<std::string> read_curve_key(const std::string& file, bool secret, std::string& err) {
  std::ifstream in(file);
  if (!in) {
    err = file + ": cannot read it";
    return std::nullopt;
  }
  struct stat st {};
  if (secret && ::stat(file.c_str(), &st) == 0 && (st.st_mode & (S_IRWXG | S_IRWXO))) {
    err = file + ": a secret key readable by group or others; `chmod 600` it";
    return std::nullopt;
  }
  for (std::string line; std::getline(in, line);) {
    const auto key = key_on_line(line);
    if (key && key->empty()) continue;
    if (!key) {
      err = file + ": expected a CURVE key of 40 Z85 characters (as `launch keygen` writes)" +
            (secret ? std::string() : ", got \"" + line + "\"");
      return std::nullopt;
    }
    return *key;
  }
  err = file + ": no key in it";
  return std::nullopt;
}

std::optional<std::vector<std::string>> read_curve_clients(const std::string& file, std::string& err) {
  std::ifstream in(file);
  if (!in) {
    err = file + ": cannot read it";
    return std::nullopt;
  }
  std::vector<std::string> keys;
  int n = 0;
  for (std::string line; std::getline(in, line);) {
    ++n;
    const auto key = key_on_line(line);
    if (key && key->empty()) continue;
    if (!key) {
      err = file + ":" + std::to_string(n) + ": expected a public CURVE key of 40 Z85 characters, got \"" + line + "\"";
      return std::nullopt;
    }
    keys.push_back(*key);
  }
  if (keys.empty()) {
    err = file + ": no key in it (one reader's public key per line)";
    return std::nullopt;
  }
  return keys;
}

std::pair<std::string, std::string> curve_keypair() {
  char pub[41] = {0}, sec[41] = {0};
  if (zmq_curve_keypair(pub, sec) != 0) throw std::runtime_error("zmq_curve_keypair failed: CURVE is not available");
  return {pub, sec};
}

std::string curve_public_of(const std::string& secret_z85) {
  char pub[41] = {0};
  if (zmq_curve_public(pub, secret_z85.c_str()) != 0) throw std::runtime_error("zmq_curve_public failed");
  return pub;
}

}  // namespace kernelrl
