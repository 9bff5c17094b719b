// Tokenizer: Hugging Face tokenizer.json with a byte-level BPE model, as GPT-2, Qwen2 and Llama 3
// ship it. Supported pieces, each read from the file and anything else refused with a clear
// TokenizerError naming the field:
//   normalizer     null, NFC, or a Sequence of those
//   pre_tokenizer  ByteLevel (add_prefix_space, use_regex with the GPT-2 pattern), Split (a regex
//                  run by PCRE2 with Unicode classes; Isolated, Removed, MergedWithPrevious,
//                  MergedWithNext, Contiguous; invert), Digits, or a Sequence of those
//   model          BPE with merges (either on-disk form), ignore_merges, unk_token
//   added_tokens   matched before everything else (leftmost, longest; lstrip/rstrip honoured)
//   decoder        ByteLevel
// encode() is Hugging Face's encode(text, add_special_tokens=False): the post-processor (a BOS a
// template adds) is left to the prompt template, which writes such markers itself.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace kernelrl {

struct TokenizerError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Tokenizer {
 public:
  // Reads PATH (a tokenizer.json, or a model directory holding one). Throws TokenizerError.
  static std::shared_ptr<Tokenizer> load(const std::string& path);
  ~Tokenizer();

  // Token ids of `text` (valid UTF-8, else TokenizerError).
  std::vector<int32_t> encode(const std::string& text) const;
  // Text of `ids`; bytes that do not form valid UTF-8 become U+FFFD, as in Hugging Face.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const;
  // The raw bytes one token stands for (an added token: its content). Empty for an unknown id.
  const std::string& token_bytes(int32_t id) const;
  // The id of a token string as written in the vocabulary or added tokens.
  std::optional<int32_t> token_id(const std::string& token) const;
  bool is_special(int32_t id) const;
  // One past the largest id (vocabulary and added tokens).
  int32_t vocab_size() const;

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// `s` with invalid UTF-8 sequences replaced by U+FFFD.
std::string utf8_lossy(const std::string& s);
// True if `s` is valid UTF-8.
bool utf8_valid(const std::string& s);
// Unicode NFC of valid UTF-8 `s` (canonical decomposition, reordering and composition).
std::string nfc(const std::string& s);

}  // namespace kernelrl
