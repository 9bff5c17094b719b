// The tokenizer on a byte-level BPE small enough to work out by hand: merges applied by rank (the
// lowest-ranked adjacent pair first, as BPE defines it), GPT-2's pre-tokenization and byte map
// (a space is "Ġ"), added tokens matched before everything else, decode(encode(s)) == s, and a
// tokenizer.json it cannot read refused naming the field. The expected ids are also HF tokenizers'
// for the same file (tokenizers.Tokenizer.from_file, 2026-11-29); parity on real vocabularies:
// tests/e2e/test_policy.py.
#include "policy/tokenizer.hpp"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

namespace fs = std::filesystem;
using kernelrl::Tokenizer;
using kernelrl::TokenizerError;

namespace {

nlohmann::json small_bpe() {
  return nlohmann::json::parse(R"({
    "normalizer": null,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
    "model": {"type": "BPE",
              "vocab": {"a": 0, "b": 1, "c": 2, "\u0120": 3, "ab": 4, "abc": 5, "\u0120a": 6, "bc": 7},
              "merges": ["a b", "ab c", "\u0120 a", "b c"]},
    "added_tokens": [{"id": 8, "content": "<|end|>", "special": true, "lstrip": false, "rstrip": false}],
    "decoder": {"type": "ByteLevel"}
  })");
}

// The tokenizer `j` describes, written to a file of its own.
std::shared_ptr<Tokenizer> load(const nlohmann::json& j) {
  const fs::path path = fs::temp_directory_path() / ("kernelrl-tokenizer-" + std::to_string(::getpid()) + ".json");
  std::ofstream(path) << j.dump();
  struct Remove {
    fs::path p;
    ~Remove() { fs::remove(p); }
  } remove{path};
  return Tokenizer::load(path.string());
}

// The message `j` is refused with ("" when it loads).
std::string refusal(const nlohmann::json& j) {
  try {
    load(j);
  } catch (const TokenizerError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("BPE merges by rank, after GPT-2's pre-tokenization and byte map", "[tokenizer]") {
  auto t = load(small_bpe());
  CHECK(t->vocab_size() == 9);
  // a b -> ab (rank 0), then ab c -> abc (rank 1); b c (rank 3) never gets its turn.
  CHECK(t->encode("abc") == std::vector<int32_t>{5});
  CHECK(t->encode("bc") == std::vector<int32_t>{7});
  // " abc" is a word of its own, its space the byte-level "Ġ": a b (rank 0) goes before Ġ a
  // (rank 2), so Ġ stays alone: [Ġ, abc], not [Ġa, bc].
  CHECK(t->encode("abc abc") == std::vector<int32_t>{5, 3, 5});
  CHECK(t->encode(" a") == std::vector<int32_t>{6});
  CHECK(t->decode({5, 3, 5}) == "abc abc");
  CHECK(t->token_bytes(3) == " ");
  CHECK(t->token_id("\xC4\xA0"
                    "a") == 6);  // "Ġa"
}

TEST_CASE("added tokens are matched before the words around them", "[tokenizer]") {
  auto t = load(small_bpe());
  CHECK(t->encode("abc<|end|>bc") == std::vector<int32_t>{5, 8, 7});
  CHECK(t->is_special(8));
  CHECK_FALSE(t->is_special(5));
  CHECK(t->decode({5, 8, 7}) == "abc<|end|>bc");
  CHECK(t->decode({5, 8, 7}, /*skip_special=*/true) == "abcbc");
  CHECK_THROWS_AS(t->encode(std::string("a\xFF", 2)), TokenizerError);  // not UTF-8
}

TEST_CASE("a tokenizer.json it cannot read is refused naming the field", "[tokenizer]") {
  auto j = small_bpe();
  j["normalizer"] = {{"type", "Lowercase"}};
  CHECK(refusal(j).find("normalizer: type Lowercase is not supported") != std::string::npos);

  j = small_bpe();
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "Sideways"}}, {{"type", "ByteLevel"}}}}};
  CHECK(refusal(j).find("pre_tokenizer.pretokenizers[0].behavior: Sideways is not supported") != std::string::npos);

  j = small_bpe();
  j["pre_tokenizer"] = {{"type", "Digits"}};
  CHECK(refusal(j).find("no ByteLevel step") != std::string::npos);

  j = small_bpe();
  j["model"]["merges"] = {"a z"};
  CHECK(refusal(j).find("model.merges[0]: \"a z\" names a token not in the vocabulary") != std::string::npos);

  j = small_bpe();
  j["model"]["byte_fallback"] = true;
  CHECK(refusal(j).find("model.byte_fallback") != std::string::npos);

  j = small_bpe();
  j["model"]["vocab"]["b"] = -1;
  CHECK(refusal(j).find("model.vocab.b: negative id") != std::string::npos);

  CHECK(refusal(small_bpe()).empty());
}
