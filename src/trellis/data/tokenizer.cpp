#include "trellis/data/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "trellis/core/atomic_file.h"
#include "trellis/core/error.h"
#include "trellis/data/sentencepiece.h"

namespace trellis {

namespace {

class ByteTokenizer final : public Tokenizer {
 public:
  std::vector<int> encode(std::string_view text) const override {
    std::vector<int> out(text.size());
    for (size_t i = 0; i < text.size(); ++i) out[i] = static_cast<unsigned char>(text[i]);
    return out;
  }
  std::string decode(const std::vector<int>& tokens) const override {
    std::string out(tokens.size(), '\0');
    for (size_t i = 0; i < tokens.size(); ++i) {
      TRELLIS_REQUIRE(tokens[i] >= 0 && tokens[i] < 256,
                      "byte tokenizer: token {} is outside the vocabulary (0..255)", tokens[i]);
      out[i] = static_cast<char>(tokens[i]);
    }
    return out;
  }
  int vocab_size() const override { return 256; }
  int eot_token() const override { return -1; }
  std::string kind() const override { return "byte"; }
};

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Decodes one UTF-8 sequence at s[i]; returns false on malformed input. Only used on the
// tokenizer files, whose keys nlohmann::json has already validated as UTF-8.
bool next_utf8(std::string_view s, size_t& i, uint32_t& cp) {
  const auto c = static_cast<unsigned char>(s[i]);
  int len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
  if (len == 0 || i + len > s.size()) return false;
  cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
  for (int k = 1; k < len; ++k) {
    const auto cc = static_cast<unsigned char>(s[i + k]);
    if ((cc >> 6) != 0x2) return false;
    cp = (cp << 6) | (cc & 0x3F);
  }
  i += len;
  return true;
}

// GPT-2's bytes_to_unicode(): printable bytes map to themselves, the other 68 to U+0100.. in
// byte order, so every byte has a visible, non-space symbol in encoder.json / vocab.bpe.
std::array<uint32_t, 256> bytes_to_unicode() {
  std::array<uint32_t, 256> map{};
  std::array<bool, 256> printable{};
  for (int b = '!'; b <= '~'; ++b) printable[b] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) printable[b] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) printable[b] = true;
  uint32_t n = 0;
  for (int b = 0; b < 256; ++b) map[b] = printable[b] ? static_cast<uint32_t>(b) : 256 + n++;
  return map;
}

// GPT-2's pre-tokenisation pattern (encoder.py), verbatim.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class Gpt2Tokenizer final : public Tokenizer {
 public:
  explicit Gpt2Tokenizer(const std::string& dir) {
    namespace fs = std::filesystem;
    const std::string enc_path = (fs::path(dir) / "encoder.json").string();
    const std::string bpe_path = (fs::path(dir) / "vocab.bpe").string();
    TRELLIS_REQUIRE(fs::is_regular_file(enc_path),
                    "{}: GPT-2 tokenizer file not found (the tokenizer directory needs "
                    "encoder.json and vocab.bpe)",
                    enc_path);
    TRELLIS_REQUIRE(fs::is_regular_file(bpe_path),
                    "{}: GPT-2 tokenizer file not found (the tokenizer directory needs "
                    "encoder.json and vocab.bpe)",
                    bpe_path);
    load_encoder(enc_path);
    load_merges(bpe_path);
    compile_pattern();
  }

  ~Gpt2Tokenizer() override {
    if (re_ != nullptr) pcre2_code_free(re_);
  }
  Gpt2Tokenizer(const Gpt2Tokenizer&) = delete;
  Gpt2Tokenizer& operator=(const Gpt2Tokenizer&) = delete;

  std::vector<int> encode(std::string_view text) const override {
    std::vector<int> out;
    out.reserve(text.size() / 3 + 1);
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(re_, nullptr);
    TRELLIS_CHECK(md != nullptr, "pcre2_match_data_create failed");
    // One lock per call: the word cache is shared, and encode() is called on whole documents.
    std::lock_guard<std::mutex> lock(cache_mutex_);
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t pos = 0;
    while (pos < text.size()) {
      const int rc = pcre2_match(re_, subject, text.size(), pos, 0, md, nullptr);
      size_t start = text.size(), end = text.size();
      if (rc >= 0) {
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
        start = ov[0];
        end = ov[1];
      } else if (rc != PCRE2_ERROR_NOMATCH) {
        pcre2_match_data_free(md);
        TRELLIS_CHECK(false, "pcre2_match failed with code {}", rc);
      }
      // Bytes the pattern skipped (only invalid UTF-8 can be skipped) still get encoded, so
      // decode(encode(s)) == s holds for arbitrary bytes, not only for valid text.
      if (start > pos) bpe_word(text.substr(pos, start - pos), out);
      if (end > start) bpe_word(text.substr(start, end - start), out);
      if (end == pos) break;  // cannot happen (every alternative consumes input), but never spin
      pos = end;
    }
    pcre2_match_data_free(md);
    return out;
  }

  std::string decode(const std::vector<int>& tokens) const override {
    std::string out;
    for (int t : tokens) {
      TRELLIS_REQUIRE(t >= 0 && t < vocab_size_,
                      "gpt2 tokenizer: token {} is outside the vocabulary (0..{})", t,
                      vocab_size_ - 1);
      out += decoded_[t];
    }
    return out;
  }

  int vocab_size() const override { return vocab_size_; }
  int eot_token() const override { return eot_; }
  std::string kind() const override { return "gpt2"; }

 private:
  struct Merge {
    int rank;
    int merged;
  };

  static uint64_t pair_key(int a, int b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  void load_encoder(const std::string& path) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(read_file(path));
    } catch (const nlohmann::json::exception& e) {
      TRELLIS_REQUIRE(false, "{}: not valid JSON: {}", path, e.what());
    }
    TRELLIS_REQUIRE(j.is_object() && !j.empty(),
                    "{}: expected a JSON object mapping token strings to ids", path);
    int max_id = -1;
    for (const auto& [key, value] : j.items()) {
      TRELLIS_REQUIRE(value.is_number_integer(), "{}: token '{}' has a non-integer id", path, key);
      const auto id = value.get<int64_t>();
      TRELLIS_REQUIRE(id >= 0 && id < (1 << 24), "{}: token '{}' has id {} out of range", path, key,
                      id);
      max_id = std::max(max_id, static_cast<int>(id));
    }
    vocab_size_ = max_id + 1;
    // Checked before allocating per id: otherwise a 20-byte file naming id 16,777,215 would
    // allocate half a GiB of strings only to be refused below.
    TRELLIS_REQUIRE(size_t(vocab_size_) == j.size(),
                    "{}: ids are not contiguous: {} tokens, but the largest id is {}", path,
                    j.size(), max_id);
    decoded_.assign(vocab_size_, std::string());
    std::vector<bool> seen(vocab_size_, false);

    const auto b2u = bytes_to_unicode();
    std::unordered_map<uint32_t, int> u2b;
    for (int b = 0; b < 256; ++b) u2b[b2u[b]] = b;

    encoder_.reserve(j.size());
    for (const auto& [key, value] : j.items()) {
      const int id = value.get<int>();
      TRELLIS_REQUIRE(!seen[id], "{}: id {} is used by more than one token", path, id);
      seen[id] = true;
      encoder_.emplace(key, id);
      if (key == "<|endoftext|>") {
        eot_ = id;
        decoded_[id] = key;  // special token: decodes to its literal text, as GPT-2 does
        continue;
      }
      std::string bytes;
      size_t i = 0;
      uint32_t cp = 0;
      while (i < key.size()) {
        TRELLIS_REQUIRE(next_utf8(key, i, cp), "{}: token '{}' is not valid UTF-8", path, key);
        auto it = u2b.find(cp);
        TRELLIS_REQUIRE(it != u2b.end(),
                        "{}: token '{}' contains U+{:04X}, which is not a GPT-2 byte symbol", path,
                        key, cp);
        bytes += static_cast<char>(it->second);
      }
      decoded_[id] = std::move(bytes);
    }
    for (int id = 0; id < vocab_size_; ++id)
      TRELLIS_REQUIRE(seen[id], "{}: ids are not contiguous: id {} is missing (vocabulary {})",
                      path, id, vocab_size_);
    TRELLIS_REQUIRE(eot_ >= 0, "{}: no '<|endoftext|>' token", path);
    for (int b = 0; b < 256; ++b) {
      std::string sym;
      append_utf8(sym, b2u[b]);
      auto it = encoder_.find(sym);
      TRELLIS_REQUIRE(it != encoder_.end(), "{}: no token for byte 0x{:02X} (symbol '{}')", path, b,
                      sym);
      byte_token_[b] = it->second;
    }
  }

  void load_merges(const std::string& path) {
    const std::string data = read_file(path);
    size_t pos = 0;
    int line_no = 0, rank = 0;
    while (pos < data.size()) {
      size_t nl = data.find('\n', pos);
      if (nl == std::string::npos) nl = data.size();
      std::string_view line(data.data() + pos, nl - pos);
      pos = nl + 1;
      ++line_no;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line_no == 1 && line.starts_with("#version")) continue;
      if (line.empty()) continue;
      const size_t sp = line.find(' ');
      TRELLIS_REQUIRE(sp != std::string_view::npos && sp > 0 && sp + 1 < line.size() &&
                          line.find(' ', sp + 1) == std::string_view::npos,
                      "{}:{}: malformed merge line '{}' (expected two symbols separated by one "
                      "space)",
                      path, line_no, line);
      const std::string a(line.substr(0, sp)), b(line.substr(sp + 1));
      const auto ia = encoder_.find(a), ib = encoder_.find(b), im = encoder_.find(a + b);
      TRELLIS_REQUIRE(ia != encoder_.end() && ib != encoder_.end() && im != encoder_.end(),
                      "{}:{}: merge '{}' uses or produces a symbol missing from encoder.json", path,
                      line_no, line);
      // emplace keeps the first (lowest-rank) entry should a pair repeat.
      merges_.emplace(pair_key(ia->second, ib->second), Merge{rank++, im->second});
    }
    TRELLIS_REQUIRE(!merges_.empty(), "{}: no merges found", path);
  }

  void compile_pattern() {
    int err = 0;
    PCRE2_SIZE erroff = 0;
    // MATCH_INVALID_UTF: text files are not guaranteed to be valid UTF-8; invalid bytes are
    // simply not matched and encode() picks them up between matches.
    re_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kGpt2Pattern), PCRE2_ZERO_TERMINATED,
                        PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &erroff, nullptr);
    if (re_ == nullptr) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      TRELLIS_CHECK(false, "pcre2_compile of the GPT-2 pattern failed at {}: {}", erroff,
                    reinterpret_cast<const char*>(msg));
    }
    // JIT is an optional speed-up; without it pcre2_match interprets the pattern.
    pcre2_jit_compile(re_, PCRE2_JIT_COMPLETE);
  }

  // Byte-pair merges of one pre-token, exactly as GPT-2's Encoder.bpe(): repeatedly merge every
  // occurrence of the lowest-ranked adjacent pair, left to right.
  void bpe_word(std::string_view word, std::vector<int>& out) const {
    auto cached = cache_.find(std::string(word));
    if (cached != cache_.end()) {
      out.insert(out.end(), cached->second.begin(), cached->second.end());
      return;
    }
    std::vector<int> syms(word.size());
    for (size_t i = 0; i < word.size(); ++i) syms[i] = byte_token_[static_cast<uint8_t>(word[i])];
    std::vector<int> next;
    while (syms.size() > 1) {
      int best_rank = std::numeric_limits<int>::max(), first = -1, second = -1, merged = -1;
      for (size_t i = 0; i + 1 < syms.size(); ++i) {
        auto it = merges_.find(pair_key(syms[i], syms[i + 1]));
        if (it != merges_.end() && it->second.rank < best_rank) {
          best_rank = it->second.rank;
          first = syms[i];
          second = syms[i + 1];
          merged = it->second.merged;
        }
      }
      if (merged < 0) break;
      next.clear();
      for (size_t i = 0; i < syms.size();) {
        if (i + 1 < syms.size() && syms[i] == first && syms[i + 1] == second) {
          next.push_back(merged);
          i += 2;
        } else {
          next.push_back(syms[i++]);
        }
      }
      syms.swap(next);
    }
    out.insert(out.end(), syms.begin(), syms.end());
    // Bound memory on huge corpora with many distinct words; the hot words come back quickly.
    if (cache_.size() >= kMaxCacheEntries) cache_.clear();
    cache_.emplace(std::string(word), std::move(syms));
  }

  static constexpr size_t kMaxCacheEntries = 1 << 20;

  std::unordered_map<std::string, int> encoder_;
  std::vector<std::string> decoded_;  // id -> raw bytes
  std::array<int, 256> byte_token_{};
  std::unordered_map<uint64_t, Merge> merges_;
  int vocab_size_ = 0;
  int eot_ = -1;
  pcre2_code* re_ = nullptr;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int>> cache_;
};

}  // namespace

std::unique_ptr<Tokenizer> make_byte_tokenizer() { return std::make_unique<ByteTokenizer>(); }

std::unique_ptr<Tokenizer> load_gpt2_tokenizer(const std::string& dir) {
  TRELLIS_REQUIRE(!dir.empty(),
                  "gpt2 tokenizer: no tokenizer directory given (it must hold "
                  "encoder.json and vocab.bpe)");
  TRELLIS_REQUIRE(std::filesystem::is_directory(dir),
                  "{}: GPT-2 tokenizer directory not found (it must hold encoder.json and "
                  "vocab.bpe)",
                  dir);
  return std::make_unique<Gpt2Tokenizer>(dir);
}

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& kind, const std::string& dir) {
  if (kind == "byte") return make_byte_tokenizer();
  if (kind == "gpt2") return load_gpt2_tokenizer(dir);
  if (kind == "sentencepiece") return load_sentencepiece_tokenizer(dir);
  TRELLIS_REQUIRE(false, "unknown tokenizer '{}' (expected 'byte', 'gpt2' or 'sentencepiece')",
                  kind);
  return nullptr;
}

SpecialToken task_special_token(const Tokenizer& tok) {
  if (tok.eot_token() >= 0) return {tok.eot_token(), tok.vocab_size()};
  return {tok.vocab_size(), tok.vocab_size() + 1};
}

DecodeStream::DecodeStream(const Tokenizer& tok, std::vector<int> context)
    : tok_(tok), ids_(std::move(context)) {
  printed_ = tok_.decode(ids_).size();
}

std::string DecodeStream::push(int token) {
  ids_.push_back(token);
  const std::string text = tok_.decode(ids_);
  // U+FFFD at the end: a character whose remaining bytes have not been generated yet.
  static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
  size_t stable = text.size();
  while (stable >= printed_ + kReplacement.size() &&
         std::string_view(text).substr(stable - kReplacement.size(), kReplacement.size()) ==
             kReplacement)
    stable -= kReplacement.size();
  if (stable <= printed_) return {};
  std::string out = text.substr(printed_, stable - printed_);
  printed_ = stable;
  return out;
}

std::string DecodeStream::finish() {
  const std::string text = tok_.decode(ids_);
  std::string out = text.size() > printed_ ? text.substr(printed_) : std::string();
  printed_ = text.size();
  return out;
}

}  // namespace trellis
