#pragma once
// fastText's subword features (Bojanowski et al. 2017) for a token vocabulary: each token's
// input is its embedding plus the mean of the embeddings of the character n-grams of the word it
// belongs to, hashed into a table of `buckets` rows. Rare tokens then share evidence with every
// word that contains the same pieces ("ção", "ij"), as a character n-gram model does, where a
// token embedding learns from the few texts that hold that token. A pure function of the token
// strings and the token sequence, so every rank and layout computes the same bags.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "trellis/model/config.h"

namespace trellis {

// 32-bit FNV-1a, fastText's n-gram hash.
uint32_t fnv1a(std::string_view bytes);

class SubwordNgrams {
 public:
  // token_bytes[id]: the token's text as bytes, a leading space marking the start of a word (as
  // GPT-2's byte-level BPE writes it); empty for special tokens, which have no n-grams and end a
  // word. cfg: subword_ngrams (buckets), ngram_min, ngram_max.
  SubwordNgrams(std::vector<std::string> token_bytes, const ModelConfig& cfg);
  int64_t buckets() const { return buckets_; }
  // The bags of one sequence tokens[0, n): a word is a token whose text starts with a space (or
  // the first after a special token or the sequence start) and the tokens after it that do not;
  // each of its tokens gets the bucket of every character n-gram (min_n <= n <= max_n, UTF-8
  // characters, a continuation byte belonging to the character before it) of "<word>", the
  // word's bytes without the leading space. Bag t is ids[offsets[t], offsets[t + 1]); offsets
  // has n + 1 entries. Appends to ids/offsets (offsets starting at ids.size()).
  void bags(const int32_t* tokens, int64_t n, std::vector<int32_t>& ids,
            std::vector<int64_t>& offsets) const;

 private:
  // The buckets of the n-grams of "<word>" appended to ids.
  void word_buckets(std::string_view word, std::vector<int32_t>& ids) const;
  std::vector<std::string> token_bytes_;
  int64_t buckets_;
  int min_n_, max_n_;
};

}  // namespace trellis
