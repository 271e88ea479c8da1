#pragma once
// The subword n-gram table of a model (model/subword_ngrams.h) from its tokenizer's strings.
#include <memory>
#include <string>

namespace trellis {

struct ModelConfig;
class SubwordNgrams;  // model/subword_ngrams.h, which callers include to own the result

// Null when cfg.subword_ngrams is 0; else built from the tokenizer of kind `kind` in `dir` (as
// data/meta.json and checkpoints record it). Refuses (input error naming the key) a tokenizer
// whose token strings do not say where words start: only GPT-2's byte-level BPE is supported (a
// byte token has no n-grams; a SentencePiece piece's decoded text drops its word-start marker).
std::unique_ptr<SubwordNgrams> subword_ngrams_for(const ModelConfig& cfg, const std::string& kind,
                                                  const std::string& dir);

}  // namespace trellis
