#pragma once
// The token streams a run trains and validates on, loaded from a data directory (or the embedded
// default corpus).
#include <cstdint>
#include <string>
#include <vector>

namespace trellis {

struct Corpus {
  std::vector<uint16_t> train, val;
  std::string tokenizer = "byte";  // kind, see Tokenizer::kind()
  std::string tokenizer_dir;
  int vocab_size = 256;
  std::string source;  // human-readable description for the log
};

// Reads every train*.bin / val*.bin in `dir` (sorted by name, concatenated) and meta.json if
// present (without one, tokenizer is inferred: max token < 256 -> byte, else gpt2 with vocab
// 50257).
Corpus load_corpus_dir(const std::string& dir);
// Default corpus when --data is not given: the licence texts every Debian system ships in
// /usr/share/common-licenses, byte-tokenised, last 10% as validation.
Corpus load_default_corpus();

}  // namespace trellis
