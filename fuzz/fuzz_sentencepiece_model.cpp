// SentencePiece model loader (data/sentencepiece): a tokenizer.model's bytes, parsed by
// libsentencepiece. A model that loads must encode text to ids below its size, and decode them
// (not necessarily to the same text: a model may normalise it).
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz/fuzz_common.h"
#include "trellis/data/sentencepiece.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trellis;
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  fuzz::expect_parse_or_input_error([&] {
    const auto tok = make_sentencepiece_tokenizer(bytes, "tokenizer.model");
    for (const std::string_view text :
         {std::string_view(
              "Hello world, it's 2024!\n\n  caf\xc3\xa9 \xe6\xbc\xa2 \xf0\x9f\x98\x80"),
          std::string_view(bytes).substr(0, std::min<size_t>(bytes.size(), 64))}) {
      const std::vector<int> ids = tok->encode(text);
      for (int id : ids) fuzz::require(id >= 0 && id < tok->vocab_size(), "ids in the vocabulary");
      tok->decode(ids);
    }
    fuzz::require(tok->eot_token() < tok->vocab_size(), "eot in range");
  });
  return 0;
}
