#pragma once
// Files that must be whole or absent: checked writes made durable before they are renamed into
// place, and manifests (each file's size and SHA-256) that say a folder of them is complete.
//
// Fault injection for tests: KERNELRL_INJECT_ENOSPC=PATH[:N] makes the N-th (default: every)
// checked write of a file whose path ends with PATH (whole components: "learner.json",
// "step-1.partial/learner.json") fail as a full disk does (ENOSPC).

#include <cstddef>
#include <cstdint>
#include <string>

namespace kernelrl {

// Writes `data` to PATH.tmp, flushes it to disk, renames it to PATH and flushes the folder; false
// (with `err` naming the file and the reason) leaves PATH as it was. `mode`: the new file's
// permissions (before the umask).
bool write_file_durably(const std::string& path, const std::string& data, std::string& err, unsigned mode = 0644);

// Flushes a file or folder already written to disk; false with `err` when it cannot.
bool sync_path(const std::string& path, std::string& err);

// Whether a checked write of the file at `path` should fail now (the fault injection above).
bool inject_enospc(const std::string& path);

// Writes DIR/manifest.json: every regular file in DIR (not in subfolders) with its size and
// SHA-256, after flushing each to disk. Written last and durably: a folder with a manifest that
// verifies is complete.
bool write_manifest(const std::string& dir, std::string& err);

// Checks DIR against its manifest: every listed file present with its size (and, with `hashes`,
// its SHA-256). False with `why` when it does not hold or there is no manifest.
bool verify_manifest(const std::string& dir, bool hashes, std::string& why);

// SHA-256 over pieces fed in order (OpenSSL); hex() ends it and gives the digest in lowercase hex.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  Sha256& add(const void* data, size_t n);
  Sha256& add_u64(uint64_t v);              // 8 bytes, little-endian
  Sha256& add_sized(const std::string& s);  // its length (add_u64), then its bytes
  std::string hex();

 private:
  void* ctx_;
};

}  // namespace kernelrl
