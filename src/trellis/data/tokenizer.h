#pragma once
// Tokenizers: byte-level (256 symbols) and GPT-2 BPE (encoder.json + vocab.bpe).
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace trellis {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int> encode(std::string_view text) const = 0;
  virtual std::string decode(const std::vector<int>& tokens) const = 0;
  virtual int vocab_size() const = 0;
  // Token that separates documents (GPT-2: 50256 <|endoftext|>); -1 when there is none.
  virtual int eot_token() const = 0;
  // "byte" or "gpt2": recorded in data/meta.json and checkpoints so `sample` can decode.
  virtual std::string kind() const = 0;
};

std::unique_ptr<Tokenizer> make_byte_tokenizer();
// Loads encoder.json and vocab.bpe from `dir`; a missing/corrupt file throws an input error
// naming the file.
std::unique_ptr<Tokenizer> load_gpt2_tokenizer(const std::string& dir);
// kind "byte" needs no dir; kind "gpt2" needs the directory holding the two files.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& kind, const std::string& dir);

}  // namespace trellis
