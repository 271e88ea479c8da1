#include "trellis/model/subword_ngrams.h"

#include "trellis/core/error.h"

namespace trellis {

uint32_t fnv1a(std::string_view bytes) {
  uint32_t h = 2166136261u;
  for (unsigned char b : bytes) h = (h ^ b) * 16777619u;
  return h;
}

SubwordNgrams::SubwordNgrams(std::vector<std::string> token_bytes, const ModelConfig& cfg)
    : token_bytes_(std::move(token_bytes)),
      buckets_(cfg.subword_ngrams),
      min_n_(cfg.ngram_min),
      max_n_(cfg.ngram_max) {
  TRELLIS_CHECK(buckets_ > 0 && min_n_ >= 1 && min_n_ <= max_n_, "subword n-grams: bad config");
  TRELLIS_CHECK(int64_t(token_bytes_.size()) == cfg.vocab_size,
                "subword n-grams: {} token strings for a vocabulary of {}", token_bytes_.size(),
                cfg.vocab_size);
}

void SubwordNgrams::word_buckets(std::string_view word, std::vector<int32_t>& ids) const {
  std::string text = "<";
  text.append(word);
  text.push_back('>');
  // Character starts: a byte that is not a UTF-8 continuation byte (10xxxxxx) starts one.
  std::vector<size_t> starts;
  for (size_t i = 0; i < text.size(); ++i)
    if ((uint8_t(text[i]) & 0xC0) != 0x80 || starts.empty()) starts.push_back(i);
  starts.push_back(text.size());
  const int chars = int(starts.size()) - 1;
  for (int n = min_n_; n <= max_n_; ++n)
    for (int i = 0; i + n <= chars; ++i)
      ids.push_back(int32_t(fnv1a(std::string_view(text).substr(
                                starts[size_t(i)], starts[size_t(i + n)] - starts[size_t(i)])) %
                            uint32_t(buckets_)));
}

void SubwordNgrams::bags(const int32_t* tokens, int64_t n, std::vector<int32_t>& ids,
                         std::vector<int64_t>& offsets) const {
  offsets.push_back(int64_t(ids.size()));
  std::vector<int32_t> word_ids;
  for (int64_t i = 0; i < n;) {
    const std::string& first = token_bytes_[size_t(tokens[i])];
    if (first.empty()) {  // a special token: no n-grams, ends the word before it
      offsets.push_back(int64_t(ids.size()));
      ++i;
      continue;
    }
    int64_t j = i + 1;
    std::string word = first;
    for (; j < n; ++j) {
      const std::string& next = token_bytes_[size_t(tokens[j])];
      if (next.empty() || next[0] == ' ') break;
      word += next;
    }
    word_ids.clear();
    word_buckets(std::string_view(word).substr(word[0] == ' ' ? 1 : 0), word_ids);
    for (; i < j; ++i) {
      ids.insert(ids.end(), word_ids.begin(), word_ids.end());
      offsets.push_back(int64_t(ids.size()));
    }
  }
}

}  // namespace trellis
