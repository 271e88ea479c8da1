#pragma once
// SentencePiece tokenizers (kind "sentencepiece") through Google's library (libsentencepiece):
// a model file loaded (ours, or e.g. a LLaMA-2 or T5 tokenizer.model), or one trained on text.
//
// Text is encoded line by line: each line exactly as SentencePiece encodes a sentence (what
// python3-sentencepiece's encode(line) gives), the lines joined by the id of the newline (its
// own piece, or its byte piece <0x0A> under byte fallback; nothing for a model with neither).
// So a chunk of text cut after a newline encodes as it would inside the whole text, and decode
// inverts encode wherever SentencePiece's own decode does.
//
// Models trellis trains keep the text as it is: identity normalisation (no NFKC), whitespace
// kept (no collapsing of repeated or trailing spaces), byte fallback (a character outside the
// vocabulary becomes its UTF-8 byte pieces, never <unk>), <unk> 0, <s> 1, </s> 2, no <pad>. So
// decode(encode(s)) == s for any valid UTF-8 text.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "trellis/data/tokenizer.h"

namespace trellis {

// The file name of a SentencePiece model in data directories, checkpoints and exports (as in
// Hugging Face directories).
inline constexpr const char* kSentencePieceFile = "tokenizer.model";

// Loads a serialized model (the bytes of a .model file); `path` names it in errors. Bytes that
// are not a SentencePiece model are an input error naming path.
std::unique_ptr<Tokenizer> make_sentencepiece_tokenizer(const std::string& bytes,
                                                        const std::string& path);
// Loads dir/tokenizer.model.
std::unique_ptr<Tokenizer> load_sentencepiece_tokenizer(const std::string& dir);

struct SentencePieceOptions {
  int vocab_size = 8000;         // pieces, <unk> <s> </s> and the 256 byte pieces included
  std::string type = "unigram";  // "unigram" or "bpe"
  // Sentences (lines) the trainer keeps: beyond this many it keeps a seeded sample of them
  // (SentencePiece's input_sentence_size with shuffle_input_sentence), so memory is bounded.
  // More than 100.
  int64_t sentences = 1'000'000;
  // Share of the characters that must be pieces of their own; the rarest others are spelt by
  // byte pieces. 1.0 suits small alphabets; 0.9995 (SentencePiece's default) large ones (CJK).
  double character_coverage = 1.0;
};

// Where training sentences come from: next() gives one line at a time, false at the end.
class SentenceSource {
 public:
  virtual ~SentenceSource() = default;
  virtual bool next(std::string& sentence) = 0;
};

// The lines of text files, in order, read as they are needed (a line keeps a trailing \r).
std::unique_ptr<SentenceSource> lines_of_files(std::vector<std::string> files);
// The lines of texts held in memory (each text split at its newlines); they must outlive it.
std::unique_ptr<SentenceSource> lines_of_texts(std::vector<std::string_view> texts);

// Trains a model on the sentences of `source` and returns it serialized (a tokenizer.model's
// bytes). Deterministic: the same sentences give the same bytes on any machine (fixed seed and
// thread count). SentencePiece's refusals (a vocabulary too large or too small for the text)
// are input errors naming `what` (the input).
std::string train_sentencepiece(const SentencePieceOptions& opt, SentenceSource& source,
                                const std::string& what);
// Checks the options before any work: vocab_size, type, sentences and coverage in range.
void check_sentencepiece_options(const SentencePieceOptions& opt);

// The model `prepare` uses: the file model_path (--tokenizer-model) when given, else one trained
// on source's sentences (`what` names the input in errors). Returns its bytes.
std::string prepare_sentencepiece_model(const std::string& model_path,
                                        const SentencePieceOptions& opt, SentenceSource& source,
                                        const std::string& what);

}  // namespace trellis
