// Safetensors: the tensor file format of Hugging Face checkpoints and PEFT adapters.
// Reading maps the file (mmap) and checks every header field against the file before any tensor
// is touched: a truncated, overlapping or lying file is a SafetensorsError naming the file and the
// tensor, never a crash. Writing produces files that the `safetensors` Python package reads.
// Torch-free: tensors are raw little-endian bytes plus dtype and shape.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace kernelrl {

struct SafetensorsError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The dtypes kernelrl reads and writes, spelled as in the format ("F32", "BF16", ...).
enum class StDtype { F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL };
size_t st_dtype_size(StDtype d);
const char* st_dtype_name(StDtype d);

// One tensor inside a mapped file (data points into the mapping; valid while the file lives).
struct StTensorView {
  std::string name;
  StDtype dtype = StDtype::F32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
  int64_t numel() const;
};

class SafetensorsFile {
 public:
  // Maps and validates `path`; throws SafetensorsError ("PATH: what is wrong").
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<StTensorView>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The tensor called `name`, or nullptr.
  const StTensorView* find(const std::string& name) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t size_ = 0;
  std::vector<StTensorView> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// A tensor to write: bytes must hold numel * dtype size bytes.
struct StTensorRef {
  std::string name;
  StDtype dtype = StDtype::F32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t nbytes = 0;
};

// Writes `tensors` (sorted by name, as the Python package does) and `metadata` to `path`
// atomically (a temporary file renamed into place). Throws SafetensorsError.
void write_safetensors(const std::string& path, const std::vector<StTensorRef>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace kernelrl
