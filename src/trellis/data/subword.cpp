#include "trellis/data/subword.h"

#include "trellis/core/error.h"
#include "trellis/data/tokenizer.h"
#include "trellis/model/config.h"
#include "trellis/model/subword_ngrams.h"

namespace trellis {

std::unique_ptr<SubwordNgrams> subword_ngrams_for(const ModelConfig& cfg, const std::string& kind,
                                                  const std::string& dir) {
  if (cfg.subword_ngrams == 0) return nullptr;
  TRELLIS_REQUIRE(kind == "gpt2",
                  "config key 'subword_ngrams': needs GPT-2 BPE tokens (`prepare --tokenizer "
                  "gpt2`), the data's tokenizer is {}",
                  kind);
  const std::unique_ptr<Tokenizer> owned = load_gpt2_tokenizer(dir);
  const Tokenizer& tok = *owned;
  TRELLIS_REQUIRE(cfg.vocab_size <= tok.vocab_size(),
                  "config key 'subword_ngrams': the model's vocabulary ({}) is larger than the "
                  "tokenizer's ({})",
                  cfg.vocab_size, tok.vocab_size());
  std::vector<std::string> bytes(size_t(cfg.vocab_size));
  for (int id = 0; id < cfg.vocab_size; ++id)
    if (id != tok.eot_token()) bytes[size_t(id)] = tok.decode({id});  // the special stays empty
  return std::make_unique<SubwordNgrams>(std::move(bytes), cfg);
}

}  // namespace trellis
