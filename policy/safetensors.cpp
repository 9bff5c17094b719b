#include "policy/safetensors.hpp"

#include "core/files.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace kernelrl {

namespace {

// A header larger than this is refused before it is read (the Python package's limit).
constexpr uint64_t max_header_bytes = 100ull << 20;

struct DtypeInfo {
  StDtype d;
  const char* name;
  size_t size;
};
constexpr DtypeInfo dtypes[] = {
    {StDtype::F64, "F64", 8}, {StDtype::F32, "F32", 4},   {StDtype::F16, "F16", 2}, {StDtype::BF16, "BF16", 2},
    {StDtype::I64, "I64", 8}, {StDtype::I32, "I32", 4},   {StDtype::I16, "I16", 2}, {StDtype::I8, "I8", 1},
    {StDtype::U8, "U8", 1},   {StDtype::BOOL, "BOOL", 1},
};

[[noreturn]] void fail(const std::string& path, const std::string& what) { throw SafetensorsError(path + ": " + what); }

}  // namespace

size_t st_dtype_size(StDtype d) {
  for (auto& x : dtypes)
    if (x.d == d) return x.size;
  return 0;
}

const char* st_dtype_name(StDtype d) {
  for (auto& x : dtypes)
    if (x.d == d) return x.name;
  return "?";
}

int64_t StTensorView::numel() const {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  return n;
}

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::shared_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    fail(path, std::string("cannot stat: ") + std::strerror(errno));
  }
  f->size_ = static_cast<size_t>(st.st_size);
  if (f->size_ < 8) {
    ::close(fd);
    fail(path, "truncated: " + std::to_string(f->size_) + " bytes, not even the 8-byte header length");
  }
  void* m = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) fail(path, std::string("cannot map: ") + std::strerror(errno));
  f->map_ = m;
  const auto* base = static_cast<const uint8_t*>(m);

  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | base[i];
  if (header_len > max_header_bytes)
    fail(path, "header length " + std::to_string(header_len) + " is over the 100 MiB limit");
  if (header_len > f->size_ - 8)
    fail(path, "truncated: header of " + std::to_string(header_len) + " bytes, but only " +
                   std::to_string(f->size_ - 8) + " follow the length");
  nlohmann::json h;
  try {
    h = nlohmann::json::parse(base + 8, base + 8 + header_len);
  } catch (const nlohmann::json::exception& e) {
    fail(path, std::string("header is not valid JSON: ") + e.what());
  }
  if (!h.is_object()) fail(path, "header is not a JSON object");
  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = f->size_ - data_start;

  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") {
      if (!it->is_object()) fail(path, "__metadata__ is not an object");
      for (auto m2 = it->begin(); m2 != it->end(); ++m2) {
        if (!m2->is_string()) fail(path, "__metadata__." + m2.key() + " is not a string");
        f->metadata_[m2.key()] = m2->get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor " + name + ": ";
    const auto& t = *it;
    if (!t.is_object() || !t.contains("dtype") || !t.contains("shape") || !t.contains("data_offsets"))
      fail(path, where + "expected an object with dtype, shape and data_offsets");
    if (!t["dtype"].is_string()) fail(path, where + "dtype is not a string");
    StTensorView v;
    v.name = name;
    std::string dn = t["dtype"];
    bool known = false;
    for (auto& x : dtypes)
      if (dn == x.name) v.dtype = x.d, known = true;
    if (!known) fail(path, where + "dtype " + dn + " is not supported");
    if (!t["shape"].is_array()) fail(path, where + "shape is not an array");
    uint64_t numel = 1;
    for (auto& s : t["shape"]) {
      if (!s.is_number_unsigned()) fail(path, where + "shape holds a value that is not a non-negative integer");
      uint64_t d = s.get<uint64_t>();
      if (d != 0 && numel > (uint64_t(1) << 62) / d) fail(path, where + "shape is too large");
      numel *= d;
      v.shape.push_back(static_cast<int64_t>(d));
    }
    const auto& off = t["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      fail(path, where + "data_offsets is not [begin, end]");
    uint64_t b = off[0], e = off[1];
    if (e < b) fail(path, where + "data_offsets end " + std::to_string(e) + " is before begin " + std::to_string(b));
    if (e > data_size)
      fail(path, where + "data_offsets end " + std::to_string(e) + " is past the end of the data (" +
                     std::to_string(data_size) + " bytes): the file is truncated or its header lies");
    uint64_t want = numel * st_dtype_size(v.dtype);
    if (e - b != want)
      fail(path,
           where + "holds " + std::to_string(e - b) + " bytes, but its dtype and shape need " + std::to_string(want));
    v.data = base + data_start + b;
    v.nbytes = static_cast<size_t>(e - b);
    ranges.emplace_back(b, e);
    f->index_[name] = f->tensors_.size();
    f->tensors_.push_back(std::move(v));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second) fail(path, "two tensors' data_offsets overlap");
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, size_);
}

const StTensorView* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

void write_safetensors(const std::string& path, const std::vector<StTensorRef>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<const StTensorRef*> order;
  for (auto& t : tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->name < b->name; });
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (auto& [k, v] : metadata) m[k] = v;
    h["__metadata__"] = m;
  }
  uint64_t offset = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    const auto& t = *order[i];
    if (i > 0 && t.name == order[i - 1]->name) fail(path, "tensor " + t.name + " is given twice");
    uint64_t numel = 1;
    for (auto s : t.shape) {
      if (s < 0) fail(path, "tensor " + t.name + ": negative dimension");
      numel *= static_cast<uint64_t>(s);
    }
    if (numel * st_dtype_size(t.dtype) != t.nbytes)
      fail(path, "tensor " + t.name + ": " + std::to_string(t.nbytes) + " bytes given, its shape needs " +
                     std::to_string(numel * st_dtype_size(t.dtype)));
    h[t.name] = {{"dtype", st_dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.nbytes}}};
    offset += t.nbytes;
  }
  std::string header = h.dump();
  while ((8 + header.size()) % 8 != 0) header.push_back(' ');  // data starts 8-byte aligned
  std::string tmp = path + ".tmp";
  FILE* out = std::fopen(tmp.c_str(), "wb");
  if (!out) fail(tmp, std::string("cannot create: ") + std::strerror(errno));
  uint8_t len[8];
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
  bool ok = std::fwrite(len, 1, 8, out) == 8 && std::fwrite(header.data(), 1, header.size(), out) == header.size();
  for (auto* t : order)
    if (ok && t->nbytes) ok = std::fwrite(t->data, 1, t->nbytes, out) == t->nbytes;
  if (ok && inject_enospc(path)) ok = false, errno = ENOSPC;
  ok = (std::fclose(out) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    fail(path, std::string("cannot write: ") + std::strerror(errno));
  }
}

}  // namespace kernelrl
