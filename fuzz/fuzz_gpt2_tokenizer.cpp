// GPT-2 tokenizer loader (data/tokenizer): encoder.json and vocab.bpe. The input is the two files
// separated by the first NUL byte (neither holds one when valid). A vocabulary that loads must
// encode text to ids below its size and decode them back to the same bytes.
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz/fuzz_common.h"
#include "trellis/data/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trellis;
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  fuzz::write_scratch("encoder.json", in.substr(0, nul));
  fuzz::write_scratch("vocab.bpe", nul == std::string_view::npos ? "" : in.substr(nul + 1));
  fuzz::expect_parse_or_input_error([&] {
    const auto tok = load_gpt2_tokenizer(fuzz::scratch_dir().string());
    for (const std::string_view text :
         {std::string_view("Hello world, it's 2024!\n\n  <|endoftext|> caf\xc3\xa9 \xff\xfe"),
          in.substr(0, std::min<size_t>(in.size(), 64))}) {
      const std::vector<int> ids = tok->encode(text);
      for (int id : ids) fuzz::require(id >= 0 && id < tok->vocab_size(), "ids in the vocabulary");
      fuzz::require(tok->decode(ids) == text, "decode(encode(text)) == text");
    }
    fuzz::require(tok->eot_token() >= 0 && tok->eot_token() < tok->vocab_size(), "eot in range");
  });
  return 0;
}
