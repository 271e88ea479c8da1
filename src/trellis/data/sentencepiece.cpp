#include "trellis/data/sentencepiece.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <exception>
#include <filesystem>
#include <fstream>
#include <limits>
#include <thread>
#include <unordered_map>

#include "trellis/core/atomic_file.h"
#include "trellis/core/error.h"
#include "trellis/model/config.h"

namespace trellis {

namespace {

// SentencePiece's messages start with the source location of its check
// ("./src/trainer_interface.cc(580) [(...) <= (...)] Vocabulary size is ..."): users need the
// sentence after it.
std::string sp_message(const sentencepiece::util::Status& s) {
  std::string m = s.message();
  if (m.rfind("./", 0) == 0 || m.rfind("src/", 0) == 0)
    if (const size_t at = m.find("] "); at != std::string::npos) m = m.substr(at + 2);
  return m;
}

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(const std::string& bytes, const std::string& path) {
    sentencepiece::util::Status status;
    std::string why;
    try {
      status = sp_.LoadFromSerializedProto(bytes);
      if (!status.ok()) why = sp_message(status);
    } catch (const std::exception& e) {
      // Its trie builder throws on some malformed models (an empty piece; found by fuzzing).
      status = {sentencepiece::util::StatusCode::kInternal, e.what()};
      why = e.what();
    }
    TRELLIS_REQUIRE(status.ok(), "{}: not a SentencePiece model{}", path,
                    why.empty() ? "" : " (" + why + ")");
    vocab_ = sp_.GetPieceSize();
    TRELLIS_REQUIRE(vocab_ > 0 && vocab_ <= kMaxVocab, "{}: a SentencePiece model of {} pieces",
                    path, vocab_);
    // The newline's own piece, else its byte piece; -1 when the model can spell neither.
    const int unk = sp_.unk_id();
    for (const char* piece : {"\n", "<0x0A>"}) {
      const int id = sp_.PieceToId(piece);
      if (id >= 0 && id != unk) {
        newline_ = id;
        break;
      }
    }
  }

  std::vector<int> encode(std::string_view text) const override {
    std::vector<int> out, line;
    for (size_t pos = 0;;) {
      const size_t nl = text.find('\n', pos);
      const std::string_view s = text.substr(pos, nl == std::string_view::npos ? nl : nl - pos);
      if (!s.empty()) {
        const auto status = sp_.Encode(s, &line);
        TRELLIS_CHECK(status.ok(), "SentencePiece encode failed: {}", sp_message(status));
        out.insert(out.end(), line.begin(), line.end());
      }
      if (nl == std::string_view::npos) break;
      if (newline_ >= 0) out.push_back(newline_);
      pos = nl + 1;
    }
    return out;
  }

  std::string decode(const std::vector<int>& tokens) const override {
    std::string out, piece;
    std::vector<int> line;
    auto flush = [&] {
      const auto status = sp_.Decode(line, &piece);
      TRELLIS_CHECK(status.ok(), "SentencePiece decode failed: {}", sp_message(status));
      out += piece;
      line.clear();
    };
    for (int t : tokens) {
      TRELLIS_REQUIRE(t >= 0 && t < vocab_,
                      "sentencepiece tokenizer: token {} is outside the vocabulary (0..{})", t,
                      vocab_ - 1);
      if (t == newline_) {
        flush();
        out += '\n';
      } else {
        line.push_back(t);
      }
    }
    flush();
    return out;
  }

  int vocab_size() const override { return vocab_; }
  // </s> separates documents and is a task's special token (BOS/EOS/CLS), as in T5 and Marian.
  int eot_token() const override { return sp_.eos_id(); }
  std::string kind() const override { return "sentencepiece"; }

 private:
  sentencepiece::SentencePieceProcessor sp_;
  int vocab_ = 0;
  int newline_ = -1;
};

// SentencePiece pulls sentences through its iterator; an exception of the source (a read error)
// is kept and rethrown once training returns rather than thrown through the library.
class Feed final : public sentencepiece::SentenceIterator {
 public:
  explicit Feed(SentenceSource& source) : source_(source) { Next(); }
  bool done() const override { return done_; }
  void Next() override {
    try {
      done_ = !source_.next(value_);
    } catch (...) {
      error_ = std::current_exception();
      done_ = true;
    }
  }
  const std::string& value() const override { return value_; }
  sentencepiece::util::Status status() const override {
    if (!error_) return {};
    return {sentencepiece::util::StatusCode::kInternal, "reading the input failed"};
  }
  std::exception_ptr error() const { return error_; }

 private:
  SentenceSource& source_;
  std::string value_;
  bool done_ = false;
  std::exception_ptr error_;
};

// The longest line the trainer takes (SentencePiece's default is 4192 bytes: paragraphs of
// running text are lines too). Longer lines are skipped while they are read, so a file without
// newlines costs no more memory than one line.
constexpr size_t kMaxLineBytes = size_t(1) << 16;

class FileLines final : public SentenceSource {
 public:
  explicit FileLines(std::vector<std::string> files)
      : files_(std::move(files)), buf_(kMaxLineBytes + 1) {}
  bool next(std::string& line) override {
    while (true) {
      if (in_.is_open()) {
        in_.getline(buf_.data(), std::streamsize(buf_.size()));
        const auto n = size_t(in_.gcount());
        if (in_.fail() && !in_.eof()) {  // longer than kMaxLineBytes: skip the rest of it
          in_.clear();
          in_.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
          continue;
        }
        if (n > 0) {
          line.assign(buf_.data(), in_.eof() ? n : n - 1);  // gcount counts the newline
          return true;
        }
        TRELLIS_REQUIRE(in_.eof() && !in_.bad(), "{}: read failed", files_[at_ - 1]);
        in_.close();
      }
      if (at_ == files_.size()) return false;
      in_.clear();
      in_.open(files_[at_++], std::ios::binary);
      TRELLIS_REQUIRE(in_.is_open(), "{}: cannot read", files_[at_ - 1]);
    }
  }

 private:
  std::vector<std::string> files_;
  size_t at_ = 0;
  std::ifstream in_;
  std::vector<char> buf_;
};

class TextLines final : public SentenceSource {
 public:
  explicit TextLines(std::vector<std::string_view> texts) : texts_(std::move(texts)) {}
  bool next(std::string& line) override {
    if (at_ == texts_.size()) return false;
    const std::string_view t = texts_[at_];
    const size_t nl = t.find('\n', pos_);
    line.assign(t.substr(pos_, nl == std::string_view::npos ? nl : nl - pos_));
    if (nl == std::string_view::npos) {
      ++at_;
      pos_ = 0;
    } else {
      pos_ = nl + 1;
    }
    return true;
  }

 private:
  std::vector<std::string_view> texts_;
  size_t at_ = 0, pos_ = 0;
};

// Training threads: fixed, because SentencePiece's result depends on them (the unigram EM and
// the BPE counts are summed per thread), never on the machine's cores.
constexpr int kTrainThreads = 4;
constexpr unsigned kTrainSeed = 1337;

}  // namespace

std::unique_ptr<Tokenizer> make_sentencepiece_tokenizer(const std::string& bytes,
                                                        const std::string& path) {
  return std::make_unique<SentencePieceTokenizer>(bytes, path);
}

std::unique_ptr<Tokenizer> load_sentencepiece_tokenizer(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / kSentencePieceFile).string();
  TRELLIS_REQUIRE(std::filesystem::is_regular_file(path), "{}: SentencePiece model not found",
                  path);
  return make_sentencepiece_tokenizer(read_file(path), path);
}

std::unique_ptr<SentenceSource> lines_of_files(std::vector<std::string> files) {
  return std::make_unique<FileLines>(std::move(files));
}

std::unique_ptr<SentenceSource> lines_of_texts(std::vector<std::string_view> texts) {
  return std::make_unique<TextLines>(std::move(texts));
}

void check_sentencepiece_options(const SentencePieceOptions& opt) {
  TRELLIS_REQUIRE(opt.vocab_size >= 1 && opt.vocab_size <= kMaxVocab,
                  "--vocab-size {}: must be between 1 and {}", opt.vocab_size, kMaxVocab);
  TRELLIS_REQUIRE(opt.type == "unigram" || opt.type == "bpe",
                  "--sp-type '{}': expected unigram or bpe", opt.type);
  // (SentencePiece's own bound: a sample of 100 lines or fewer is refused.)
  TRELLIS_REQUIRE(opt.sentences > 100, "--sp-sentences {}: must be more than 100", opt.sentences);
  TRELLIS_REQUIRE(opt.character_coverage > 0.0 && opt.character_coverage <= 1.0,
                  "--sp-character-coverage {}: must be in (0, 1]", opt.character_coverage);
}

std::string train_sentencepiece(const SentencePieceOptions& opt, SentenceSource& source,
                                const std::string& what) {
  check_sentencepiece_options(opt);
  const std::unordered_map<std::string, std::string> args = {
      {"model_type", opt.type},
      {"vocab_size", std::to_string(opt.vocab_size)},
      {"character_coverage", fmt::format("{}", opt.character_coverage)},
      {"byte_fallback", "true"},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"input_sentence_size", std::to_string(opt.sentences)},
      {"shuffle_input_sentence", "true"},
      {"max_sentence_length", std::to_string(kMaxLineBytes)},
      {"num_threads", std::to_string(kTrainThreads)},
      {"minloglevel", "2"}};  // its progress lines are many; errors come back as a Status
  std::string model;
  sentencepiece::util::Status status;
  std::exception_ptr input_error;
  // The sample of sentences is drawn from a thread-local generator seeded on its thread's first
  // use: a fresh thread per training makes every training in a process draw the same sample.
  std::thread worker([&] {
    sentencepiece::SetRandomGeneratorSeed(kTrainSeed);
    Feed feed(source);
    status = sentencepiece::SentencePieceTrainer::Train(args, &feed, &model);
    input_error = feed.error();
  });
  worker.join();
  if (input_error) std::rethrow_exception(input_error);
  TRELLIS_REQUIRE(status.ok(),
                  "{}: SentencePiece training failed: {} (--vocab-size {}, --sp-type {}, "
                  "--sp-character-coverage {})",
                  what, sp_message(status), opt.vocab_size, opt.type, opt.character_coverage);
  return model;
}

std::string prepare_sentencepiece_model(const std::string& model_path,
                                        const SentencePieceOptions& opt, SentenceSource& source,
                                        const std::string& what) {
  if (model_path.empty()) return train_sentencepiece(opt, source, what);
  TRELLIS_REQUIRE(std::filesystem::is_regular_file(model_path), "{}: SentencePiece model not found",
                  model_path);
  std::string bytes = read_file(model_path);
  make_sentencepiece_tokenizer(bytes, model_path);  // refuses what is not a model, naming it
  return bytes;
}

}  // namespace trellis
