#pragma once
// The token streams a run trains and validates on, loaded from a data directory (or the embedded
// default corpus).
#include <cstdint>
#include <string>
#include <vector>

#include "trellis/data/token_stream.h"

namespace trellis {

struct Corpus {
  TokenStream train, val;          // mapped shards (or, for the default corpus, tokens in memory)
  std::string tokenizer = "byte";  // kind, see Tokenizer::kind()
  std::string tokenizer_dir;
  int vocab_size = 256;
  std::string source;  // human-readable description for the log
};

// Maps every train*.bin / val*.bin in `dir` (sorted by name, concatenated), reading their headers
// only, and reads meta.json if present. Without one the tokenizer is inferred from the first
// kInferTokens tokens of each shard: max token < 256 -> byte, else gpt2 with vocab 50257. Tokens
// are checked against the vocabulary where they are read (TokenStream::read).
constexpr int64_t kInferTokens = 1 << 16;
Corpus load_corpus_dir(const std::string& dir);
// Default corpus when --data is not given: the licence texts every Debian system ships in
// /usr/share/common-licenses, byte-tokenised, last 10% as validation.
Corpus load_default_corpus();

}  // namespace trellis
