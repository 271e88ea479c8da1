#pragma once
// Tokenizers: byte-level (256 symbols), GPT-2 BPE (encoder.json + vocab.bpe) and SentencePiece
// (tokenizer.model, data/sentencepiece.h).
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
  // "byte", "gpt2" or "sentencepiece": recorded in data/meta.json and checkpoints so `sample`
  // can decode.
  virtual std::string kind() const = 0;
};

std::unique_ptr<Tokenizer> make_byte_tokenizer();
// Loads encoder.json and vocab.bpe from `dir`; a missing/corrupt file throws an input error
// naming the file.
std::unique_ptr<Tokenizer> load_gpt2_tokenizer(const std::string& dir);
// kind "byte" needs no dir; kind "gpt2" needs the directory holding the two files; kind
// "sentencepiece" the directory holding tokenizer.model (a data directory or a checkpoint).
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& kind, const std::string& dir);

// A task's special token (it begins and ends sequences; a classifier's CLS) and the model
// vocabulary that holds it: the tokenizer's end-of-text token where it has one (GPT-2's
// <|endoftext|>, SentencePiece's </s>), else one new id after its vocabulary (byte: 256 of 257).
struct SpecialToken {
  int id = -1, vocab_size = 0;
};
SpecialToken task_special_token(const Tokenizer& tok);

// Decodes generated tokens as they come: push() returns the text they add to what was printed.
// A SentencePiece piece's text depends on its neighbours (a word's leading space is dropped at
// the start of a text, bytes of one character may come in several tokens), so the stream
// decodes the whole sequence and holds back text that is not final yet (a trailing U+FFFD).
class DecodeStream {
 public:
  DecodeStream(const Tokenizer& tok, std::vector<int> context);
  std::string push(int token);
  // What is still held back (an incomplete character at the end).
  std::string finish();

 private:
  const Tokenizer& tok_;
  std::vector<int> ids_;
  size_t printed_ = 0;  // bytes of decode(ids_) already returned (the context's included)
};

}  // namespace trellis
