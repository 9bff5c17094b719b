#include "policy/tokenizer.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <climits>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <unordered_map>

namespace kernelrl {

namespace {
#include "nfc_tables.inc"  // generated at build time by policy/gen_nfc_tables.py
}  // namespace

// ---------------------------------------------------------------- UTF-8

namespace {

// Length of the valid UTF-8 sequence at s[i], or 0 if it is not one.
size_t utf8_seq(const std::string& s, size_t i, uint32_t* cp = nullptr) {
  auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char c = b(i);
  size_t n = s.size() - i;
  if (c < 0x80) {
    if (cp) *cp = c;
    return 1;
  }
  auto cont = [&](size_t k) { return k < s.size() && (b(k) & 0xC0) == 0x80; };
  if (c >= 0xC2 && c <= 0xDF && n >= 2 && cont(i + 1)) {
    if (cp) *cp = ((c & 0x1F) << 6) | (b(i + 1) & 0x3F);
    return 2;
  }
  if (c >= 0xE0 && c <= 0xEF && n >= 3 && cont(i + 1) && cont(i + 2)) {
    uint32_t v = ((c & 0x0F) << 12) | ((b(i + 1) & 0x3F) << 6) | (b(i + 2) & 0x3F);
    if (v < 0x800 || (v >= 0xD800 && v <= 0xDFFF)) return 0;
    if (cp) *cp = v;
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4 && n >= 4 && cont(i + 1) && cont(i + 2) && cont(i + 3)) {
    uint32_t v = ((c & 0x07) << 18) | ((b(i + 1) & 0x3F) << 12) | ((b(i + 2) & 0x3F) << 6) | (b(i + 3) & 0x3F);
    if (v < 0x10000 || v > 0x10FFFF) return 0;
    if (cp) *cp = v;
    return 4;
  }
  return 0;
}

void put_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::vector<uint32_t> to_codepoints(const std::string& s) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < s.size();) {
    uint32_t cp = 0;
    size_t n = utf8_seq(s, i, &cp);
    out.push_back(n ? cp : 0xFFFD);
    i += n ? n : 1;
  }
  return out;
}

}  // namespace

bool utf8_valid(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    size_t n = utf8_seq(s, i);
    if (!n) return false;
    i += n;
  }
  return true;
}

std::string utf8_lossy(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    size_t n = utf8_seq(s, i);
    if (n) {
      out.append(s, i, n);
      i += n;
      continue;
    }
    // One U+FFFD per maximal invalid prefix, as Rust's from_utf8_lossy does.
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t need = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xC2 && c <= 0xDF ? 2 : 1;
    size_t k = 1;
    while (k < need && i + k < s.size() && (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80) {
      // the second byte's valid range depends on the first
      unsigned char c2 = static_cast<unsigned char>(s[i + 1]);
      if (k == 1 && ((c == 0xE0 && c2 < 0xA0) || (c == 0xED && c2 > 0x9F) || (c == 0xF0 && c2 < 0x90) ||
                     (c == 0xF4 && c2 > 0x8F)))
        break;
      ++k;
    }
    out += "\xEF\xBF\xBD";
    i += k;
  }
  return out;
}

// ---------------------------------------------------------------- NFC

namespace {

struct NfcTables {
  std::unordered_map<uint32_t, uint8_t> ccc;
  std::unordered_map<uint32_t, std::pair<uint32_t, uint32_t>> decomp;
  std::unordered_map<uint64_t, uint32_t> comp;
  NfcTables() {
    for (auto& e : nfc_ccc) ccc[e[0]] = static_cast<uint8_t>(e[1]);
    for (auto& e : nfc_decomp) decomp[e[0]] = {e[1], e[2]};
    for (auto& e : nfc_comp) comp[(uint64_t(e[0]) << 32) | e[1]] = e[2];
  }
};
const NfcTables& nfc_tables() {
  static const NfcTables t;
  return t;
}

constexpr uint32_t SBase = 0xAC00, LBase = 0x1100, VBase = 0x1161, TBase = 0x11A7;
constexpr uint32_t LCount = 19, VCount = 21, TCount = 28, NCount = VCount * TCount, SCount = LCount * NCount;

void decompose(uint32_t cp, const NfcTables& t, std::vector<uint32_t>& out) {
  if (cp >= SBase && cp < SBase + SCount) {
    uint32_t s = cp - SBase;
    out.push_back(LBase + s / NCount);
    out.push_back(VBase + (s % NCount) / TCount);
    if (s % TCount) out.push_back(TBase + s % TCount);
    return;
  }
  auto it = t.decomp.find(cp);
  if (it == t.decomp.end()) {
    out.push_back(cp);
    return;
  }
  decompose(it->second.first, t, out);
  if (it->second.second) decompose(it->second.second, t, out);
}

uint8_t ccc_of(uint32_t cp, const NfcTables& t) {
  auto it = t.ccc.find(cp);
  return it == t.ccc.end() ? 0 : it->second;
}

}  // namespace

std::string nfc(const std::string& s) {
  bool ascii = std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
  if (ascii) return s;
  const auto& t = nfc_tables();
  std::vector<uint32_t> d;
  for (uint32_t cp : to_codepoints(s)) decompose(cp, t, d);
  // Canonical ordering: stable sort of each run of non-starters by combining class.
  for (size_t i = 0; i < d.size();) {
    if (!ccc_of(d[i], t)) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < d.size() && ccc_of(d[j], t)) ++j;
    std::stable_sort(d.begin() + i, d.begin() + j, [&](uint32_t a, uint32_t b) { return ccc_of(a, t) < ccc_of(b, t); });
    i = j;
  }
  // Canonical composition.
  std::vector<uint32_t> out;
  int64_t starter = -1;
  int last_ccc = -1;
  for (uint32_t cp : d) {
    int c = ccc_of(cp, t);
    if (starter >= 0) {
      uint32_t st = out[starter];
      bool blocked = last_ccc != -1 && (last_ccc == 0 || last_ccc >= c);
      if (!blocked) {
        uint32_t composed = 0;
        if (st >= LBase && st < LBase + LCount && cp >= VBase && cp < VBase + VCount) {
          composed = SBase + ((st - LBase) * VCount + (cp - VBase)) * TCount;
        } else if (st >= SBase && st < SBase + SCount && (st - SBase) % TCount == 0 && cp > TBase &&
                   cp < TBase + TCount) {
          composed = st + (cp - TBase);
        } else {
          auto it = t.comp.find((uint64_t(st) << 32) | cp);
          if (it != t.comp.end()) composed = it->second;
        }
        if (composed) {
          out[starter] = composed;
          continue;
        }
      }
    }
    if (c == 0) {
      starter = static_cast<int64_t>(out.size());
      last_ccc = -1;
    } else {
      last_ccc = c;
    }
    out.push_back(cp);
  }
  std::string r;
  for (uint32_t cp : out) put_utf8(r, cp);
  return r;
}

// ---------------------------------------------------------------- tokenizer

namespace {

[[noreturn]] void fail(const std::string& where, const std::string& what) { throw TokenizerError(where + ": " + what); }

// A compiled PCRE2 pattern (UTF, Unicode classes, JIT where available).
class Regex {
 public:
  Regex(const std::string& pattern, const std::string& where) {
    int err = 0;
    PCRE2_SIZE off = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                          PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &off, nullptr);
    if (!code_) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      fail(where,
           "regex does not compile at offset " + std::to_string(off) + ": " + reinterpret_cast<const char*>(msg));
    }
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if unavailable
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Non-empty matches [begin, end) of the pattern in s[from, to).
  std::vector<std::pair<size_t, size_t>> find_all(const std::string& s, size_t from, size_t to) const {
    std::vector<std::pair<size_t, size_t>> out;
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    size_t pos = from;
    auto subject = reinterpret_cast<PCRE2_SPTR>(s.data());
    while (pos <= to) {
      int rc = pcre2_match(code_, subject, to, pos, PCRE2_NO_UTF_CHECK, md, nullptr);
      if (rc < 0) break;
      PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      size_t b = ov[0], e = ov[1];
      if (e > b) {
        out.emplace_back(b, e);
        pos = e;
      } else {  // empty match: step over one character
        if (b >= to) break;
        size_t n = utf8_seq(s, b);
        pos = b + (n ? n : 1);
      }
    }
    pcre2_match_data_free(md);
    return out;
  }

 private:
  pcre2_code* code_ = nullptr;
};

const char* gpt2_pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct PreTok {
  enum Kind { ByteLevel, Split } kind = Split;
  std::shared_ptr<Regex> regex;  // Split; ByteLevel with use_regex
  std::string literal;           // Split with a String pattern
  std::string behavior = "Isolated";
  bool invert = false;
  bool add_prefix_space = false;  // ByteLevel
};

using Piece = std::pair<size_t, size_t>;

}  // namespace

struct Tokenizer::Impl {
  std::string source;
  bool nfc_normalize = false;
  std::vector<PreTok> pre;
  bool byte_level = false;  // a ByteLevel pre-tokenizer maps bytes to printable characters
  std::unordered_map<std::string, int32_t> vocab;
  std::vector<std::string> id_to_token;  // the vocabulary's spelling
  std::vector<std::string> id_bytes;     // raw bytes of each id
  std::vector<char> special;
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // (a,b) -> (rank, merged id)
  bool ignore_merges = false;
  std::optional<int32_t> unk;
  struct Added {
    std::string content;
    int32_t id;
    bool lstrip, rstrip, special;
  };
  std::vector<Added> added;  // longest first
  std::string byte_to_char[256];
  std::unordered_map<uint32_t, uint8_t> char_to_byte;
  mutable std::mutex cache_mu;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;

  // `normalizer`: null, NFC or a Sequence of those.
  void read_normalizer(const nlohmann::json& n, const std::string& where) {
    const std::string& path = source;
    if (n.is_null()) return;
    std::string type = n.value("type", "");
    if (type == "NFC") {
      nfc_normalize = true;
    } else if (type == "Sequence") {
      for (size_t i = 0; i < n["normalizers"].size(); ++i)
        read_normalizer(n["normalizers"][i], where + ".normalizers[" + std::to_string(i) + "]");
    } else {
      fail(path, where + ": type " + type + " is not supported (null, NFC or Sequence)");
    }
  }

  // `pre_tokenizer`: ByteLevel, Split, Digits or a Sequence of those.
  void read_pre_tokenizer(const nlohmann::json& p, const std::string& where) {
    const std::string& path = source;
    if (p.is_null()) return;
    std::string type = p.value("type", "");
    if (type == "Sequence") {
      for (size_t i = 0; i < p["pretokenizers"].size(); ++i)
        read_pre_tokenizer(p["pretokenizers"][i], where + ".pretokenizers[" + std::to_string(i) + "]");
    } else if (type == "ByteLevel") {
      PreTok x;
      x.kind = PreTok::ByteLevel;
      x.add_prefix_space = p.value("add_prefix_space", false);
      if (p.value("use_regex", true)) x.regex = std::make_shared<Regex>(gpt2_pattern, path + ": " + where);
      byte_level = true;
      pre.push_back(std::move(x));
    } else if (type == "Split") {
      PreTok x;
      const auto& pat = p.at("pattern");
      if (pat.contains("Regex"))
        x.regex = std::make_shared<Regex>(pat["Regex"].get<std::string>(), path + ": " + where + ".pattern");
      else if (pat.contains("String"))
        x.literal = pat["String"].get<std::string>();
      else
        fail(path, where + ".pattern: expected {\"Regex\": ...} or {\"String\": ...}");
      x.behavior = p.value("behavior", "Isolated");
      static const char* ok[] = {"Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
      if (std::find(std::begin(ok), std::end(ok), x.behavior) == std::end(ok))
        fail(path, where + ".behavior: " + x.behavior + " is not supported");
      x.invert = p.value("invert", false);
      pre.push_back(std::move(x));
    } else if (type == "Digits") {
      PreTok x;
      x.regex =
          std::make_shared<Regex>(p.value("individual_digits", false) ? "\\p{N}" : "\\p{N}+", path + ": " + where);
      pre.push_back(std::move(x));
    } else {
      fail(path, where + ": type " + type + " is not supported (ByteLevel, Split, Digits or Sequence)");
    }
  }

  // `model` (byte-level BPE: its vocabulary and merges) and `added_tokens`.
  void read_model(const nlohmann::json& m, const nlohmann::json& added_tokens) {
    const std::string& path = source;
    if (m.value("type", "BPE") != "BPE") fail(path, "model.type: " + m.value("type", "") + " is not supported (BPE)");
    if (m.contains("dropout") && !m["dropout"].is_null() && m["dropout"].get<double>() != 0)
      fail(path, "model.dropout: BPE dropout is not supported");
    if (m.value("byte_fallback", false)) fail(path, "model.byte_fallback: not supported (byte-level BPE only)");
    for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (m.contains(k) && m[k].is_string() && !m[k].get<std::string>().empty())
        fail(path, std::string("model.") + k + ": not supported");
    ignore_merges = m.value("ignore_merges", false);
    int32_t max_id = -1;
    for (auto it = m.at("vocab").begin(); it != m.at("vocab").end(); ++it) {
      int32_t id = it.value().get<int32_t>();
      if (id < 0) fail(path, "model.vocab." + it.key() + ": negative id");
      vocab[it.key()] = id;
      max_id = std::max(max_id, id);
    }
    std::vector<Added> tokens;
    for (const auto& a : added_tokens) {
      Added x{a.at("content").get<std::string>(), a.at("id").get<int32_t>(), a.value("lstrip", false),
              a.value("rstrip", false), a.value("special", false)};
      if (x.content.empty()) fail(path, "added_tokens: a token with empty content");
      max_id = std::max(max_id, x.id);
      tokens.push_back(std::move(x));
    }
    id_to_token.assign(max_id + 1, "");
    id_bytes.assign(max_id + 1, "");
    special.assign(max_id + 1, 0);
    for (auto& [tok, id] : vocab) {
      id_to_token[id] = tok;
      std::string bytes;
      for (uint32_t cp : to_codepoints(tok)) {
        auto it = char_to_byte.find(cp);
        if (it == char_to_byte.end()) {  // not a byte-level token: its spelling is its bytes
          bytes = tok;
          break;
        }
        bytes.push_back(static_cast<char>(it->second));
      }
      id_bytes[id] = bytes;
    }
    for (auto& a : tokens) {
      id_to_token[a.id] = a.content;
      id_bytes[a.id] = a.content;
      special[a.id] = a.special;
    }
    std::sort(tokens.begin(), tokens.end(), [](auto& a, auto& b) { return a.content.size() > b.content.size(); });
    added = std::move(tokens);
    if (m.contains("unk_token") && m["unk_token"].is_string()) {
      auto it = vocab.find(m["unk_token"].get<std::string>());
      if (it != vocab.end()) unk = it->second;
    }
    const auto& merge_list = m.at("merges");
    for (size_t r = 0; r < merge_list.size(); ++r) {
      std::string a, b;
      if (merge_list[r].is_string()) {
        std::string s = merge_list[r];
        auto sp = s.find(' ', 1);
        if (sp == std::string::npos) fail(path, "model.merges[" + std::to_string(r) + "]: expected \"A B\"");
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else {
        a = merge_list[r].at(0).get<std::string>();
        b = merge_list[r].at(1).get<std::string>();
      }
      auto ia = vocab.find(a), ib = vocab.find(b), im = vocab.find(a + b);
      if (ia == vocab.end() || ib == vocab.end() || im == vocab.end())
        fail(path,
             "model.merges[" + std::to_string(r) + "]: \"" + a + " " + b + "\" names a token not in the vocabulary");
      merges.emplace((uint64_t(uint32_t(ia->second)) << 32) | uint32_t(ib->second),
                     std::make_pair(static_cast<int32_t>(r), im->second));
    }
  }

  void init_byte_map() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      uint32_t cp = printable ? b : 256 + n++;
      byte_to_char[b].clear();
      put_utf8(byte_to_char[b], cp);
      char_to_byte[cp] = static_cast<uint8_t>(b);
    }
  }

  // Splits every piece of `s` by one pre-tokenizer step.
  std::vector<Piece> apply(const PreTok& p, const std::string& s, const std::vector<Piece>& in) const {
    std::vector<Piece> out;
    for (auto [b, e] : in) {
      std::vector<std::pair<Piece, bool>> parts;  // (range, is a match)
      std::vector<Piece> m;
      if (p.regex) {
        // Matched on the piece alone, as Hugging Face does: anchors and lookarounds see its ends.
        std::string sub = s.substr(b, e - b);
        for (auto [mb, me] : p.regex->find_all(sub, 0, sub.size())) m.emplace_back(b + mb, b + me);
      } else if (!p.literal.empty()) {
        for (size_t at = s.find(p.literal, b); at != std::string::npos && at + p.literal.size() <= e;
             at = s.find(p.literal, at + p.literal.size()))
          m.emplace_back(at, at + p.literal.size());
      }
      size_t prev = b;
      for (auto [mb, me] : m) {
        if (mb > prev) parts.push_back({{prev, mb}, false});
        parts.push_back({{mb, me}, true});
        prev = me;
      }
      if (prev < e) parts.push_back({{prev, e}, false});
      if (p.kind == PreTok::ByteLevel) {
        for (auto& [r, is] : parts) out.push_back(r);
        continue;
      }
      if (p.invert)
        for (auto& x : parts) x.second = !x.second;
      const std::string& bh = p.behavior;
      for (size_t i = 0; i < parts.size(); ++i) {
        auto [r, is] = parts[i];
        if (bh == "Isolated") {
          out.push_back(r);
        } else if (bh == "Removed") {
          if (!is) out.push_back(r);
        } else if (bh == "MergedWithPrevious") {
          if (is && !out.empty() && i > 0 && !parts[i - 1].second)
            out.back().second = r.second;
          else
            out.push_back(r);
        } else if (bh == "MergedWithNext") {
          if (is && i + 1 < parts.size() && !parts[i + 1].second) {
            out.push_back({r.first, parts[i + 1].first.second});
            ++i;
          } else {
            out.push_back(r);
          }
        } else {  // Contiguous
          if (is && i > 0 && parts[i - 1].second)
            out.back().second = r.second;
          else
            out.push_back(r);
        }
      }
    }
    return out;
  }

  void bpe(const std::string& word, std::vector<int32_t>& ids) const {
    {
      std::lock_guard<std::mutex> g(cache_mu);
      auto it = cache.find(word);
      if (it != cache.end()) {
        ids.insert(ids.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    std::vector<int32_t> out;
    auto whole = vocab.find(word);
    if (ignore_merges && whole != vocab.end()) {
      out.push_back(whole->second);
    } else {
      std::vector<int32_t> sym;
      for (size_t i = 0; i < word.size();) {
        size_t n = utf8_seq(word, i);
        n = n ? n : 1;
        auto it = vocab.find(word.substr(i, n));
        if (it != vocab.end()) {
          sym.push_back(it->second);
        } else if (unk) {
          if (sym.empty() || sym.back() != *unk) sym.push_back(*unk);  // unk is fused
        } else {
          throw TokenizerError(source + ": character '" + word.substr(i, n) +
                               "' is not in the vocabulary and the model has no unk_token");
        }
        i += n;
      }
      while (sym.size() > 1) {
        int32_t best_rank = INT32_MAX, best_id = -1;
        size_t best_pos = 0;
        for (size_t i = 0; i + 1 < sym.size(); ++i) {
          auto it = merges.find((uint64_t(uint32_t(sym[i])) << 32) | uint32_t(sym[i + 1]));
          if (it != merges.end() && it->second.first < best_rank) {
            best_rank = it->second.first;
            best_id = it->second.second;
            best_pos = i;
          }
        }
        if (best_id < 0) break;
        sym[best_pos] = best_id;
        sym.erase(sym.begin() + best_pos + 1);
      }
      out = std::move(sym);
    }
    ids.insert(ids.end(), out.begin(), out.end());
    std::lock_guard<std::mutex> g(cache_mu);
    if (cache.size() > 200000) cache.clear();
    cache.emplace(word, std::move(out));
  }

  void encode_plain(const std::string& text, std::vector<int32_t>& ids) const {
    if (text.empty()) return;
    std::string s = nfc_normalize ? nfc(text) : text;
    std::vector<Piece> pieces{{0, s.size()}};
    for (const auto& p : pre) {
      if (p.kind == PreTok::ByteLevel && p.add_prefix_space && !pieces.empty() && s[pieces.front().first] != ' ' &&
          pieces.size() == 1 && pieces.front().first == 0) {
        s = " " + s;
        pieces = {{0, s.size()}};
      }
      pieces = apply(p, s, pieces);
    }
    for (auto [b, e] : pieces) {
      std::string w;
      if (byte_level) {
        for (size_t i = b; i < e; ++i) w += byte_to_char[static_cast<unsigned char>(s[i])];
      } else {
        w = s.substr(b, e - b);
      }
      bpe(w, ids);
    }
  }
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

std::shared_ptr<Tokenizer> Tokenizer::load(const std::string& path_in) {
  std::string path = path_in;
  if (std::filesystem::is_directory(path)) path = (std::filesystem::path(path) / "tokenizer.json").string();
  std::ifstream in(path);
  if (!in) fail(path, "cannot open");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    fail(path, std::string("not valid JSON: ") + e.what());
  }
  auto impl = std::make_unique<Impl>();
  Impl& t = *impl;
  t.source = path;
  t.init_byte_map();
  try {
    t.read_normalizer(j.value("normalizer", nlohmann::json()), "normalizer");
    t.read_pre_tokenizer(j.value("pre_tokenizer", nlohmann::json()), "pre_tokenizer");
    if (!t.byte_level) fail(path, "pre_tokenizer: no ByteLevel step; only byte-level BPE tokenizers are supported");
    t.read_model(j.at("model"), j.value("added_tokens", nlohmann::json::array()));
    const auto& dec = j.value("decoder", nlohmann::json());
    if (!dec.is_null() && dec.value("type", "") != "ByteLevel")
      fail(path, "decoder: type " + dec.value("type", "") + " is not supported (ByteLevel)");
  } catch (const nlohmann::json::exception& e) {
    fail(path, std::string("unexpected structure: ") + e.what());
  }
  return std::shared_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

std::vector<int32_t> Tokenizer::encode(const std::string& text) const {
  if (!utf8_valid(text)) throw TokenizerError("encode: the text is not valid UTF-8");
  const Impl& t = *impl_;
  std::vector<int32_t> ids;
  size_t start = 0, i = 0;
  while (i < text.size()) {
    const Impl::Added* hit = nullptr;
    for (const auto& a : t.added)
      if (text.compare(i, a.content.size(), a.content) == 0) {
        hit = &a;
        break;
      }
    if (!hit) {
      ++i;
      continue;
    }
    size_t seg_end = i, next = i + hit->content.size();
    if (hit->lstrip)
      while (seg_end > start && std::isspace(static_cast<unsigned char>(text[seg_end - 1]))) --seg_end;
    if (hit->rstrip)
      while (next < text.size() && std::isspace(static_cast<unsigned char>(text[next]))) ++next;
    t.encode_plain(text.substr(start, seg_end - start), ids);
    ids.push_back(hit->id);
    start = i = next;
  }
  t.encode_plain(text.substr(start), ids);
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) continue;
    if (skip_special && impl_->special[id]) continue;
    bytes += impl_->id_bytes[id];
  }
  return utf8_lossy(bytes);
}

const std::string& Tokenizer::token_bytes(int32_t id) const {
  static const std::string none;
  return id < 0 || id >= vocab_size() ? none : impl_->id_bytes[id];
}

std::optional<int32_t> Tokenizer::token_id(const std::string& token) const {
  for (const auto& a : impl_->added)
    if (a.content == token) return a.id;
  auto it = impl_->vocab.find(token);
  if (it == impl_->vocab.end()) return std::nullopt;
  return it->second;
}

bool Tokenizer::is_special(int32_t id) const { return id >= 0 && id < vocab_size() && impl_->special[id]; }

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->id_to_token.size()); }

}  // namespace kernelrl
