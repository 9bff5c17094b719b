#include "policy/safetensors.hpp"
#include "policy/tokenizer.hpp"

#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>

using namespace kernelrl;

namespace {
std::string temp_file(const char* name) { return (std::filesystem::temp_directory_path() / name).string(); }
void write_raw(const std::string& path, const std::string& header, size_t data_bytes) {
  std::ofstream out(path, std::ios::binary);
  uint64_t n = header.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header << std::string(data_bytes, '\0');
}
}  // namespace

TEST_CASE("safetensors: written tensors read back with dtype, shape, bytes and metadata") {
  std::string path = temp_file("kernelrl-st-roundtrip.safetensors");
  std::vector<float> a{1, 2, 3, 4, 5, 6};
  std::vector<uint16_t> b{7, 8};
  write_safetensors(path, {{"zeta", StDtype::F32, {2, 3}, a.data(), 24}, {"alpha", StDtype::BF16, {2}, b.data(), 4}},
                    {{"format", "pt"}});
  auto f = SafetensorsFile::open(path);
  REQUIRE(f->tensors().size() == 2);
  REQUIRE(f->metadata().at("format") == "pt");
  const auto* z = f->find("zeta");
  REQUIRE(z);
  REQUIRE(z->shape == std::vector<int64_t>{2, 3});
  REQUIRE(z->dtype == StDtype::F32);
  REQUIRE(reinterpret_cast<const float*>(z->data)[5] == 6.0f);
  REQUIRE(f->find("alpha")->nbytes == 4);
  REQUIRE(f->find("missing") == nullptr);
  std::remove(path.c_str());
}

TEST_CASE("safetensors: overlapping, short and oversized entries are errors naming the tensor") {
  std::string path = temp_file("kernelrl-st-bad.safetensors");
  write_raw(
      path,
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
      12);
  REQUIRE_THROWS_WITH(SafetensorsFile::open(path), Catch::Contains("overlap"));
  write_raw(path, R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8);
  REQUIRE_THROWS_WITH(SafetensorsFile::open(path), Catch::Contains("tensor a: holds 8 bytes"));
  write_raw(path, R"({"a":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}})", 8);
  REQUIRE_THROWS_WITH(SafetensorsFile::open(path), Catch::Contains("dtype Q4 is not supported"));
  write_raw(path, R"({"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,8]}})", 8);
  REQUIRE_THROWS_WITH(SafetensorsFile::open(path), Catch::Contains("shape is too large"));
  std::remove(path.c_str());
}

TEST_CASE("nfc: composes, reorders marks and handles Hangul like Unicode's NFC") {
  REQUIRE(nfc("e\xCC\x81") == "\xC3\xA9");                                 // e + acute -> é
  REQUIRE(nfc("\xE2\x84\xAB") == "\xC3\x85");                              // angstrom sign -> Å (singleton)
  REQUIRE(nfc("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8") == "\xEA\xB0\x81");  // jamo -> 각
  REQUIRE(nfc("a\xCC\xA3\xCC\x87") == nfc("a\xCC\x87\xCC\xA3"));           // marks in canonical order
  REQUIRE(nfc("plain ascii") == "plain ascii");
  REQUIRE(utf8_lossy("a\xFF"
                     "b") ==
          "a\xEF\xBF\xBD"
          "b");
  REQUIRE_FALSE(utf8_valid("\xC0\x80"));
}
