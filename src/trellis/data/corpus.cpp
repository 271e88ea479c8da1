#include "trellis/data/corpus.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "trellis/core/atomic_file.h"
#include "trellis/core/error.h"
#include "trellis/data/shard.h"
#include "trellis/data/tokenizer.h"
#include "trellis/data/tokenizer_dir.h"

namespace trellis {

namespace fs = std::filesystem;

namespace {

constexpr const char* kDefaultCorpusDir = "/usr/share/common-licenses";
constexpr int kGpt2VocabSize = 50257;

// Sorted by name so shard order, and hence the token stream, does not depend on the file system.
std::vector<std::string> shard_files(const std::string& dir, const std::string& prefix) {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (it->is_regular_file() && name.starts_with(prefix) && name.ends_with(".bin"))
      out.push_back(it->path().string());
  }
  TRELLIS_REQUIRE(!ec, "{}: cannot list data directory: {}", dir, ec.message());
  std::sort(out.begin(), out.end());
  return out;
}

void read_meta(const std::string& dir, Corpus& c) {
  const std::string path = (fs::path(dir) / "meta.json").string();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::exception& e) {
    TRELLIS_REQUIRE(false, "{}: not valid JSON: {}", path, e.what());
  }
  TRELLIS_REQUIRE(j.is_object(), "{}: expected a JSON object", path);
  try {
    c.tokenizer = j.value("tokenizer", std::string("byte"));
    c.tokenizer_dir = j.value("tokenizer_dir", std::string());
    c.vocab_size = j.value("vocab_size", c.tokenizer == "gpt2" ? kGpt2VocabSize : 256);
  } catch (const nlohmann::json::exception& e) {
    TRELLIS_REQUIRE(false, "{}: a field has the wrong type: {}", path, e.what());
  }
  TRELLIS_REQUIRE(c.tokenizer == "byte" || c.tokenizer == "gpt2" || c.tokenizer == "sentencepiece",
                  "{}: unknown tokenizer '{}' (expected 'byte', 'gpt2' or 'sentencepiece')", path,
                  c.tokenizer);
  TRELLIS_REQUIRE(c.vocab_size > 0, "{}: vocab_size {} is not positive", path, c.vocab_size);
  // A SentencePiece model is the directory's own tokenizer.model.
  if (c.tokenizer == "sentencepiece")
    c.tokenizer_dir = fs::absolute(dir).lexically_normal().string();
  c.tokenizer_dir = resolved_tokenizer_dir(c.tokenizer_dir, dir);
}

}  // namespace

Corpus load_corpus_dir(const std::string& dir) {
  TRELLIS_REQUIRE(fs::is_directory(dir), "{}: data directory not found", dir);
  const auto train_files = shard_files(dir, "train");
  TRELLIS_REQUIRE(!train_files.empty(),
                  "{}: no train*.bin shards in the data directory (make one with `trellis "
                  "prepare`)",
                  dir);
  const auto val_files = shard_files(dir, "val");
  TRELLIS_REQUIRE(!val_files.empty(),
                  "{}: no val*.bin shards in the data directory (make one with `trellis "
                  "prepare`)",
                  dir);

  Corpus c;
  c.train = TokenStream::map_files(train_files);
  c.val = TokenStream::map_files(val_files);
  TRELLIS_REQUIRE(c.train.size() > 0, "{}: the train*.bin shards hold no tokens", dir);
  TRELLIS_REQUIRE(c.val.size() > 0, "{}: the val*.bin shards hold no tokens", dir);
  bool wide = false;  // any version-2 (uint32) shard
  for (const TokenStream* s : {&c.train, &c.val})
    for (size_t i = 0; i < s->parts(); ++i) wide |= s->part(i).version() == kShardVersion32;

  // A bounded look at the tokens: startup must not grow with the corpus. Every token read later
  // is checked against the vocabulary anyway.
  const int64_t max_token =
      std::max(c.train.max_token_sampled(kInferTokens), c.val.max_token_sampled(kInferTokens));
  const bool has_meta = fs::exists(fs::path(dir) / "meta.json");
  if (has_meta) {
    read_meta(dir, c);
    TRELLIS_REQUIRE(max_token < c.vocab_size,
                    "{}: shards hold token {} but meta.json says vocab_size {}", dir, max_token,
                    c.vocab_size);
    TRELLIS_REQUIRE(c.vocab_size <= 65536 || wide,
                    "{}: meta.json says vocab_size {}, more than the uint16 tokens of its "
                    "version-1 shards can hold (65536)",
                    dir, c.vocab_size);
  } else if (max_token < 256) {
    c.tokenizer = "byte";
    c.vocab_size = 256;
  } else {
    TRELLIS_REQUIRE(max_token < kGpt2VocabSize,
                    "{}: shards hold token {}, beyond GPT-2's vocabulary; add a meta.json with "
                    "the tokenizer and vocab_size",
                    dir, max_token);
    c.tokenizer = "gpt2";
    c.vocab_size = kGpt2VocabSize;
  }
  c.train.set_vocab(c.vocab_size);
  c.val.set_vocab(c.vocab_size);
  c.source = fmt::format("{} ({} train + {} val tokens, {} tokenizer{})",
                         fs::absolute(dir).lexically_normal().string(), c.train.size(),
                         c.val.size(), c.tokenizer, has_meta ? "" : ", no meta.json");
  return c;
}

Corpus load_default_corpus() {
  TRELLIS_REQUIRE(fs::is_directory(kDefaultCorpusDir),
                  "{}: not found, so there is no default corpus; pass a data directory "
                  "(see `trellis prepare`)",
                  kDefaultCorpusDir);
  std::vector<std::string> files;
  std::error_code ec;
  for (fs::directory_iterator it(kDefaultCorpusDir, ec), end; !ec && it != end; it.increment(ec)) {
    // Symlinks (GPL -> GPL-3, ...) are skipped: they would only repeat a text already included.
    if (it->is_regular_file() && !it->is_symlink()) files.push_back(it->path().string());
  }
  TRELLIS_REQUIRE(!ec, "{}: cannot list: {}", kDefaultCorpusDir, ec.message());
  std::sort(files.begin(), files.end());
  std::string text;
  std::vector<size_t> doc_starts;  // each licence is a document
  for (const auto& f : files) {
    const std::string t = read_file(f);
    if (!t.empty()) doc_starts.push_back(text.size());
    text += t;
  }
  TRELLIS_REQUIRE(text.size() >= 2, "{}: holds no text, so there is no default corpus",
                  kDefaultCorpusDir);

  const auto tokens = make_byte_tokenizer()->encode(text);
  const size_t n_val = std::max<size_t>(1, tokens.size() / 10);
  const size_t n_train = tokens.size() - n_val;
  Corpus c;
  // Small enough to hold in memory: no shards to map.
  auto part = [&](size_t begin, size_t end, const char* name) {
    std::vector<uint32_t> t(tokens.begin() + ptrdiff_t(begin), tokens.begin() + ptrdiff_t(end));
    std::vector<uint32_t> starts;
    for (size_t d : doc_starts)
      if (d >= begin && d < end) starts.push_back(uint32_t(d - begin));
    TokenStream s({std::make_shared<const Shard>(std::move(t), name)});
    s.set_doc_indexes({std::make_shared<const DocIndex>(std::move(starts), int64_t(end - begin),
                                                        std::string(name))});
    return s;
  };
  c.train = part(0, n_train, "default corpus (train)");
  c.val = part(n_train, tokens.size(), "default corpus (val)");
  c.tokenizer = "byte";
  c.vocab_size = 256;
  c.source = fmt::format("Debian licence texts ({}, {} bytes)", kDefaultCorpusDir, text.size());
  return c;
}

}  // namespace trellis
