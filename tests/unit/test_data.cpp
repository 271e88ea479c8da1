// Data layer: tokenizers (byte, GPT-2 BPE), llm.c shards, `prepare`, corpus loading.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "trellis/core/error.h"
#include "trellis/data/corpus.h"
#include "trellis/data/doc_index.h"
#include "trellis/data/loader.h"
#include "trellis/data/mixture.h"
#include "trellis/data/prepare.h"
#include "trellis/data/sentencepiece.h"
#include "trellis/data/shard.h"
#include "trellis/data/tokenizer.h"
#include "trellis/data/tokenizer_dir.h"

namespace fs = std::filesystem;

namespace trellis {
namespace {

// The committed GPT-2 files live next to this source file, so the tests find them whatever the
// build directory or working directory; TRELLIS_SOURCE (set by ctest for script tests) wins.
std::string gpt2_dir() {
  if (const char* src = std::getenv("TRELLIS_SOURCE"); src != nullptr && *src != '\0')
    return (fs::path(src) / "tests" / "data" / "gpt2").string();
  return (fs::path(__FILE__).parent_path().parent_path() / "data" / "gpt2").string();
}

// A scratch directory per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() / fmt::format("trellis_test_data_{}_{}_{}", ::getpid(),
                                                    info->test_suite_name(), info->name());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  std::string str() const { return path_.string(); }

 private:
  fs::path path_;
};

void write_text(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f << bytes;
}

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Runs f, expecting a trellis::Error of kind Input whose message contains every needle.
template <typename F>
void expect_input_error(F&& f, const std::vector<std::string>& needles) {
  try {
    f();
    ADD_FAILURE() << "expected trellis::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Input) << e.what();
    for (const auto& n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos)
          << "message '" << e.what() << "' lacks '" << n << "'";
  }
}

std::vector<int> to_int(const std::vector<uint32_t>& v) { return {v.begin(), v.end()}; }

// Version-1 shards from brace lists, as llm.c writes them.
using trellis::write_shard;
void write_shard(const std::string& path, std::initializer_list<uint32_t> tokens) {
  trellis::write_shard(path, std::span<const uint32_t>(tokens.begin(), tokens.size()));
}

const Tokenizer& gpt2() {
  static const auto tok = load_gpt2_tokenizer(gpt2_dir());
  return *tok;
}

// ---------------------------------------------------------------------------------------------
// Tokenizers

TEST(ByteTokenizer, RoundTripsEveryByte) {
  const auto tok = make_byte_tokenizer();
  EXPECT_EQ(tok->vocab_size(), 256);
  EXPECT_EQ(tok->eot_token(), -1);
  EXPECT_EQ(tok->kind(), "byte");
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  const auto ids = tok->encode(all);
  ASSERT_EQ(ids.size(), 256u);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(ids[b], b);
  EXPECT_EQ(tok->decode(ids), all);
  EXPECT_TRUE(tok->encode("").empty());
}

TEST(ByteTokenizer, RejectsOutOfRangeTokens) {
  const auto tok = make_byte_tokenizer();
  expect_input_error([&] { tok->decode({65, 256}); }, {"256"});
  expect_input_error([&] { tok->decode({-1}); }, {"-1"});
}

// A small SentencePiece model trained here (the ids against python3-sentencepiece's are
// tests/reference/test_sentencepiece.py's).
std::string tiny_sentencepiece(const std::string& type) {
  std::vector<std::string> lines;
  for (int i = 0; i < 300; ++i)
    lines.push_back(
        fmt::format("the {} cat sat on {} mats number {}", i % 7 ? "red" : "old", i % 5, i));
  const std::vector<std::string_view> views(lines.begin(), lines.end());
  const auto source = lines_of_texts(views);
  SentencePieceOptions opt;
  opt.vocab_size = 300;
  opt.type = type;
  return train_sentencepiece(opt, *source, "tiny");
}

TEST(SentencePiece, TrainsDeterministicallyAndEncodesLineByLine) {
  for (const std::string type : {"bpe", "unigram"}) {
    const std::string model = tiny_sentencepiece(type);
    EXPECT_EQ(model, tiny_sentencepiece(type)) << type << ": the same text, the same model";
    const auto tok = make_sentencepiece_tokenizer(model, "tiny.model");
    EXPECT_EQ(tok->kind(), "sentencepiece");
    EXPECT_EQ(tok->vocab_size(), 300);
    EXPECT_EQ(tok->eot_token(), 2);  // </s>
    const SpecialToken special = task_special_token(*tok);
    EXPECT_EQ(special.id, 2);
    EXPECT_EQ(special.vocab_size, 300);
    // Lines encode alone, joined by the newline's byte piece (<0x0A>: 3 + 10).
    const auto a = tok->encode("the red cat"), b = tok->encode("sat on 4 mats");
    std::vector<int> both = a;
    both.push_back(13);
    both.insert(both.end(), b.begin(), b.end());
    both.push_back(13);
    EXPECT_EQ(tok->encode("the red cat\nsat on 4 mats\n"), both) << type;
    EXPECT_TRUE(tok->encode("").empty());
    // Byte fallback: nothing is unknown, and every text comes back.
    for (const std::string text :
         {"the red cat\nsat on 4 mats\n", "\n\n  two  spaces ", "Привет 😀 漢字", "x"}) {
      const auto ids = tok->encode(text);
      EXPECT_EQ(std::count(ids.begin(), ids.end(), 0), 0) << text;
      EXPECT_EQ(tok->decode(ids), text) << type << ": " << text;
    }
    expect_input_error([&] { tok->decode({300}); }, {"300"});
  }
}

TEST(SentencePiece, StreamsWholeCharactersAndSpaces) {
  const auto tok = make_sentencepiece_tokenizer(tiny_sentencepiece("bpe"), "tiny.model");
  const std::string text = "the cat 😀 sat on Привет";
  const std::vector<int> prompt = tok->encode("the");
  const std::vector<int> all = tok->encode(text);
  ASSERT_TRUE(std::equal(prompt.begin(), prompt.end(), all.begin()));
  DecodeStream stream(*tok, prompt);
  std::string out;
  for (size_t i = prompt.size(); i < all.size(); ++i) {
    const std::string piece = stream.push(all[i]);
    EXPECT_EQ(piece.find("\xEF\xBF\xBD"), std::string::npos) << "no U+FFFD for split bytes";
    out += piece;
  }
  out += stream.finish();
  EXPECT_EQ("the" + out, text);
}

TEST(SentencePiece, RefusesWhatIsNotAModel) {
  expect_input_error([] { make_sentencepiece_tokenizer("hello world", "x/tokenizer.model"); },
                     {"x/tokenizer.model", "not a SentencePiece model"});
  expect_input_error([] { make_sentencepiece_tokenizer("", "empty.model"); }, {"empty.model"});
  SentencePieceOptions opt;
  opt.vocab_size = 100000;
  std::vector<std::string_view> texts = {"a few words", "and a few more"};
  const auto source = lines_of_texts(texts);
  expect_input_error([&] { train_sentencepiece(opt, *source, "small.txt"); },
                     {"small.txt", "Vocabulary size too high"});
  opt.vocab_size = 8000;
  opt.type = "word";
  expect_input_error([&] { check_sentencepiece_options(opt); }, {"--sp-type"});
  opt.type = "bpe";
  opt.sentences = 100;
  expect_input_error([&] { check_sentencepiece_options(opt); }, {"--sp-sentences 100"});
}

TEST(Tokenizer, TaskSpecialTokenIsEndOfTextOrOneMore) {
  const SpecialToken byte = task_special_token(*make_byte_tokenizer());
  EXPECT_EQ(byte.id, 256);
  EXPECT_EQ(byte.vocab_size, 257);
}

TEST(Gpt2Tokenizer, Metadata) {
  EXPECT_EQ(gpt2().vocab_size(), 50257);
  EXPECT_EQ(gpt2().eot_token(), 50256);
  EXPECT_EQ(gpt2().kind(), "gpt2");
  EXPECT_EQ(gpt2().decode({50256}), "<|endoftext|>");
}

TEST(Gpt2Tokenizer, KnownEncodings) {
  EXPECT_EQ(gpt2().encode("Hello world"), (std::vector<int>{15496, 995}));
  EXPECT_EQ(gpt2().encode("The quick brown fox jumps over the lazy dog."),
            (std::vector<int>{464, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13}));
  // The special token's text is ordinary text to encode(); only prepare inserts the id itself.
  EXPECT_EQ(gpt2().encode("<|endoftext|>"), (std::vector<int>{27, 91, 437, 1659, 5239, 91, 29}));
  EXPECT_TRUE(gpt2().encode("").empty());
  // Contractions, digits, non-Latin scripts, emoji, whitespace runs, NBSP and CRLF; ids from
  // OpenAI's encoder.py (with the `regex` module) on the same bytes.
  EXPECT_EQ(gpt2().encode("It's 2024: café naïve Ελληνικά 日本語 🎉\n\n  x\t y \u00a0z\r\n"),
            (std::vector<int>{1026,  338, 48609, 25,    40304, 41492, 7377, 243,   39377, 39377,
                              138,   115, 26180, 29945, 43000, 138,   105,  10545, 245,   98,
                              17312, 105, 45739, 252,   12520, 236,   231,  628,   220,   2124,
                              197,   331, 220,   1849,  89,    201,   198}));
}

TEST(Gpt2Tokenizer, RoundTrips) {
  const std::vector<std::string> texts = {
      "Hello world",
      "  leading spaces, trailing spaces   ",
      "tabs\tand\nnewlines\r\n\n\nand a final newline\n",
      "It's we're they've I'm you'll he'd 'quoted'",
      "numbers 12345 67.89 -0.5e10",
      "unicode: café naïve Ελληνικά русский 日本語 한국어 emoji 🎉🚀 ‰ — “quotes”",
      "mixed\u00a0nbsp and\u2003em space",
      "symbols !@#$%^&*()_+-=[]{}|;:,.<>/?`~\\\"",
      std::string("\0\x01\x7f control", 12),
      "invalid utf-8: \xff\xfe \xc3( \xe2\x82 end",  // bytes GPT-2's str-based encoder never sees
  };
  for (const auto& t : texts) EXPECT_EQ(gpt2().decode(gpt2().encode(t)), t) << t;
  // Every single byte, alone and in a run.
  std::string all;
  for (int b = 0; b < 256; ++b) {
    const std::string one(1, static_cast<char>(b));
    EXPECT_EQ(gpt2().decode(gpt2().encode(one)), one) << b;
    all += one;
  }
  EXPECT_EQ(gpt2().decode(gpt2().encode(all)), all);
}

TEST(Gpt2Tokenizer, CacheDoesNotChangeResults) {
  const std::string t = "the the the cat and the hat. The the THE";
  const auto first = gpt2().encode(t);
  EXPECT_EQ(gpt2().encode(t), first);
  EXPECT_EQ(gpt2().decode(first), t);
}

TEST(Gpt2Tokenizer, RejectsOutOfRangeTokens) {
  expect_input_error([] { gpt2().decode({50257}); }, {"50257"});
}

TEST(Gpt2Tokenizer, MissingFilesNameTheFile) {
  TempDir dir;
  expect_input_error([&] { load_gpt2_tokenizer(dir / "nope"); }, {"nope"});
  expect_input_error([&] { load_gpt2_tokenizer(dir.str()); }, {"encoder.json"});
  fs::copy_file(fs::path(gpt2_dir()) / "encoder.json", dir / "encoder.json");
  expect_input_error([&] { load_gpt2_tokenizer(dir.str()); }, {"vocab.bpe"});
  expect_input_error([&] { make_tokenizer("gpt2", ""); }, {"tokenizer directory"});
  expect_input_error([&] { make_tokenizer("wordpiece", ""); }, {"wordpiece", "sentencepiece"});
  expect_input_error([&] { make_tokenizer("sentencepiece", dir.str()); }, {"tokenizer.model"});
}

TEST(Gpt2Tokenizer, CorruptFilesNameTheFile) {
  TempDir dir;
  fs::copy_file(fs::path(gpt2_dir()) / "vocab.bpe", dir / "vocab.bpe");
  write_text(dir / "encoder.json", "{\"a\": 0, \"b\": ");
  expect_input_error([&] { load_gpt2_tokenizer(dir.str()); }, {dir / "encoder.json", "JSON"});
  write_text(dir / "encoder.json", "[1, 2, 3]");
  expect_input_error([&] { load_gpt2_tokenizer(dir.str()); }, {dir / "encoder.json"});

  fs::remove(dir / "encoder.json");
  fs::copy_file(fs::path(gpt2_dir()) / "encoder.json", dir / "encoder.json");
  write_text(dir / "vocab.bpe", "#version: 0.2\n\xc4\xa0 t\nnospace\n");
  expect_input_error([&] { load_gpt2_tokenizer(dir.str()); },
                     {dir / "vocab.bpe" + ":3", "malformed", "nospace"});
  write_text(dir / "vocab.bpe", "#version: 0.2\na b c\n");
  expect_input_error([&] { load_gpt2_tokenizer(dir.str()); }, {dir / "vocab.bpe" + ":2"});
}

// ---------------------------------------------------------------------------------------------
// Shards

TEST(Shard, RoundTrip) {
  TempDir dir;
  const std::vector<uint32_t> tokens = {0, 1, 2, 50256, 65535, 7};
  write_shard(dir / "s.bin", tokens);
  EXPECT_EQ(fs::file_size(dir / "s.bin"), 1024u + 2 * tokens.size());
  EXPECT_EQ(read_shard(dir / "s.bin"), tokens);

  // Header layout is llm.c's: magic, version, count, zeros.
  const std::string raw = read_bytes(dir / "s.bin");
  int32_t header[256];
  std::memcpy(header, raw.data(), sizeof header);
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], 1);
  EXPECT_EQ(header[2], 6);
  for (int i = 3; i < 256; ++i) EXPECT_EQ(header[i], 0);

  write_shard(dir / "empty.bin", {});
  EXPECT_TRUE(read_shard(dir / "empty.bin").empty());
  // No temp files left behind by the atomic write.
  size_t entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir.str())) ++entries;
  EXPECT_EQ(entries, 2u);
}

TEST(Shard, TruncatedFileNamesFileAndCounts) {
  TempDir dir;
  const std::string p = dir / "train_000000.bin";
  write_shard(p, std::vector<uint32_t>(1000, 3));
  fs::resize_file(p, 1024 + 2 * 998);
  expect_input_error([&] { read_shard(p); },
                     {p, "truncated", "header says 1000 tokens, file holds 998"});
  fs::resize_file(p, 100);
  expect_input_error([&] { read_shard(p); }, {p, "truncated"});
  fs::resize_file(p, 0);
  expect_input_error([&] { read_shard(p); }, {p, "truncated"});
}

TEST(Shard, ExtraBytesAreAnError) {
  TempDir dir;
  const std::string p = dir / "val_000000.bin";
  write_shard(p, {1, 2, 3});
  fs::resize_file(p, 1024 + 2 * 3 + 4);
  expect_input_error([&] { read_shard(p); }, {p, "extra"});
}

TEST(Shard, BadMagicAndVersionNameTheFile) {
  TempDir dir;
  const std::string p = dir / "x.bin";
  write_shard(p, {1, 2, 3});
  std::string raw = read_bytes(p);
  int32_t v = 12345;
  std::memcpy(raw.data(), &v, 4);
  write_text(p, raw);
  expect_input_error([&] { read_shard(p); }, {p, "magic", "12345"});

  v = kShardMagic;
  std::memcpy(raw.data(), &v, 4);
  v = 7;
  std::memcpy(raw.data() + 4, &v, 4);
  write_text(p, raw);
  expect_input_error([&] { read_shard(p); }, {p, "version 7"});
}

TEST(Shard, MissingFileNamesTheFile) {
  TempDir dir;
  expect_input_error([&] { read_shard(dir / "absent.bin"); }, {dir / "absent.bin"});
}

// ---------------------------------------------------------------------------------------------
// prepare

// Concatenation of all shards with the given prefix, in name order.
std::vector<uint32_t> read_split(const std::string& dir, const std::string& prefix) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) {
    const auto name = e.path().filename().string();
    // Shards only (each has a document index, NAME.idx, beside it).
    if (name.starts_with(prefix) && name.ends_with(".bin")) names.push_back(e.path().string());
  }
  std::sort(names.begin(), names.end());
  std::vector<uint32_t> out;
  for (const auto& n : names) {
    const auto t = read_shard(n);
    out.insert(out.end(), t.begin(), t.end());
  }
  return out;
}

TEST(Prepare, ByteCorpusRoundTripsThroughShards) {
  TempDir dir;
  fs::create_directories(dir / "in");
  // Written out of name order: prepare must sort.
  write_text(dir / "in/b.txt", "second document\nwith two lines\n");
  write_text(dir / "in/a.txt", "First document. Ünïcödé too.\n");
  write_text(dir / "in/c.txt", "third\n");
  const std::string expected =
      read_bytes(dir / "in/a.txt") + read_bytes(dir / "in/b.txt") + read_bytes(dir / "in/c.txt");

  PrepareOptions opt;
  opt.inputs = {dir / "in"};
  opt.out_dir = dir / "out";
  opt.val_fraction = 0.25;
  opt.shard_tokens = 16;
  const auto r = prepare_dataset(opt);
  EXPECT_EQ(r.train_tokens + r.val_tokens, expected.size());
  EXPECT_EQ(r.val_tokens, static_cast<size_t>(std::llround(expected.size() * 0.25)));

  EXPECT_TRUE(fs::exists(dir / "out/train_000000.bin"));
  EXPECT_TRUE(fs::exists(dir / "out/train_000001.bin"));  // 16-token shards force several
  EXPECT_TRUE(fs::exists(dir / "out/val_000000.bin"));
  for (const auto& e : fs::directory_iterator(dir / "out"))
    if (e.path().extension() == ".bin") {
      EXPECT_LE(read_shard(e.path().string()).size(), 16u);
    }

  const auto train = read_split(dir / "out", "train");
  const auto val = read_split(dir / "out", "val");
  EXPECT_EQ(train.size(), r.train_tokens);
  EXPECT_EQ(val.size(), r.val_tokens);
  auto all = to_int(train);
  const auto v = to_int(val);
  all.insert(all.end(), v.begin(), v.end());
  EXPECT_EQ(make_byte_tokenizer()->decode(all), expected);

  const auto meta = nlohmann::json::parse(read_bytes(dir / "out/meta.json"));
  EXPECT_EQ(meta["tokenizer"], "byte");
  EXPECT_EQ(meta["vocab_size"], 256);
  EXPECT_EQ(meta["train_tokens"], r.train_tokens);
  EXPECT_EQ(meta["val_tokens"], r.val_tokens);

  const Corpus c = load_corpus_dir(dir / "out");
  EXPECT_EQ(c.train.to_vector(), train);
  EXPECT_EQ(c.val.to_vector(), val);
  EXPECT_EQ(c.tokenizer, "byte");
  EXPECT_EQ(c.vocab_size, 256);
  EXPECT_NE(c.source.find("out"), std::string::npos);
}

TEST(Prepare, Gpt2InsertsEotBetweenDocuments) {
  TempDir dir;
  write_text(dir / "one.txt", "Hello world");
  write_text(dir / "two.txt", "The quick brown fox jumps over the lazy dog.");
  PrepareOptions opt;
  opt.inputs = {dir / "one.txt", dir / "two.txt"};
  opt.out_dir = dir / "out";
  opt.tokenizer = "gpt2";
  opt.tokenizer_dir = gpt2_dir();
  opt.val_fraction = 0.2;
  const auto r = prepare_dataset(opt);
  auto all = to_int(read_split(dir / "out", "train"));
  const auto val = to_int(read_split(dir / "out", "val"));
  all.insert(all.end(), val.begin(), val.end());
  EXPECT_EQ(all, (std::vector<int>{15496, 995, 50256, 464, 2068, 7586, 21831, 18045, 625, 262,
                                   16931, 3290, 13}));
  EXPECT_EQ(r.val_tokens, 3u);  // round(13 * 0.2)
  EXPECT_EQ(gpt2().decode(all),
            "Hello world<|endoftext|>The quick brown fox jumps over the lazy dog.");

  const auto meta = nlohmann::json::parse(read_bytes(dir / "out/meta.json"));
  EXPECT_EQ(meta["tokenizer"], "gpt2");
  EXPECT_EQ(meta["vocab_size"], 50257);
  EXPECT_TRUE(fs::path(meta["tokenizer_dir"].get<std::string>()).is_absolute());

  const Corpus c = load_corpus_dir(dir / "out");
  EXPECT_EQ(c.tokenizer, "gpt2");
  EXPECT_EQ(c.vocab_size, 50257);
  EXPECT_TRUE(fs::path(c.tokenizer_dir).is_absolute());
  EXPECT_TRUE(fs::exists(fs::path(c.tokenizer_dir) / "encoder.json"));
}

// meta.json's tokenizer_dir: relative when the tokenizer lies in the data directory or beside it
// (at most one level up, not the parent itself), absolute otherwise; read relative to the data
// directory, an absolute one as it is.
TEST(Prepare, TokenizerDirIsRelativeInOrBesideTheDataDirectory) {
  EXPECT_EQ(recorded_tokenizer_dir("/d/data/lm/tok", "/d/data/lm"), "tok");
  EXPECT_EQ(recorded_tokenizer_dir("/d/data/gpt2/", "/d/data/lm"), "../gpt2");
  EXPECT_EQ(recorded_tokenizer_dir("/d/data/x/../gpt2", "/d/data/lm/"), "../gpt2");
  EXPECT_EQ(recorded_tokenizer_dir("/d/data/lm", "/d/data/lm"), ".");
  EXPECT_EQ(recorded_tokenizer_dir("/d/data", "/d/data/lm"), "/d/data");
  EXPECT_EQ(recorded_tokenizer_dir("/d/other/gpt2", "/d/data/lm"), "/d/other/gpt2");
  EXPECT_EQ(recorded_tokenizer_dir("", "/d/data/lm"), "");
  EXPECT_EQ(resolved_tokenizer_dir("../gpt2", "/d/data/lm"), "/d/data/gpt2");
  EXPECT_EQ(resolved_tokenizer_dir("/d/other/gpt2", "/d/data/lm"), "/d/other/gpt2");
  EXPECT_EQ(resolved_tokenizer_dir("", "/d/data/lm"), "");
  // Relative arguments are taken from the working directory, as prepare's are.
  const std::string cwd = fs::current_path().lexically_normal().string();
  EXPECT_EQ(recorded_tokenizer_dir("gpt2", "out"), "../gpt2");
  EXPECT_EQ(resolved_tokenizer_dir("../gpt2", "out"), (fs::path(cwd) / "gpt2").string());
}

// Documents (issue 15): prepare records each file's start in the index beside its shard; streams
// answer the starts in a range, windows turn them into per-position starts.
TEST(Prepare, DocumentIndexesLocateEveryFile) {
  TempDir dir;
  fs::create_directories(dir / "in");
  write_text(dir / "in/a.txt", "aaaa");    // stream [0, 4)
  write_text(dir / "in/b.txt", "bbbbbb");  // [4, 10)
  write_text(dir / "in/c.txt", "cc");      // [10, 12)
  PrepareOptions opt;
  opt.inputs = {dir / "in"};
  opt.out_dir = dir / "out";
  opt.val_fraction = 0.25;  // val = [9, 12)
  opt.shard_tokens = 4;     // train shards [0, 4), [4, 8), [8, 9)
  EXPECT_EQ(prepare_dataset(opt).documents, 3u);
  const Corpus c = load_corpus_dir(dir / "out");
  ASSERT_TRUE(c.train.has_doc_index() && c.val.has_doc_index());
  std::vector<int64_t> s;
  c.train.doc_starts(0, 9, s);
  EXPECT_EQ(s, (std::vector<int64_t>{0, 4}));
  s.clear();
  c.train.doc_starts(1, 3, s);  // [1, 4): none
  EXPECT_TRUE(s.empty());
  s.clear();
  c.val.doc_starts(0, 3, s);
  EXPECT_EQ(s, (std::vector<int64_t>{1}));  // c.txt at stream position 10
  int32_t starts[3];
  window_doc_starts(c.train, 3, 1, starts);  // inputs [3, 6): b.txt starts at 4
  EXPECT_EQ(std::vector<int32_t>(starts, starts + 3), (std::vector<int32_t>{0, 1, 1}));
  window_doc_starts(c.train, 3, 0, starts);  // [0, 3): one document
  EXPECT_EQ(std::vector<int32_t>(starts, starts + 3), (std::vector<int32_t>{0, 0, 0}));

  // An index that disagrees with its shard is an input error naming it, at load.
  const std::string idx = dir / "out/train_000001.idx";
  write_doc_index(idx, std::vector<uint32_t>{0}, 5);
  expect_input_error([&] { load_corpus_dir(dir / "out"); }, {idx, "5 tokens", "holds 4"});
}

TEST(Prepare, RemovesStaleShardsFromAnEarlierRun) {
  TempDir dir;
  write_text(dir / "a.txt", std::string(100, 'x'));
  PrepareOptions opt;
  opt.inputs = {dir / "a.txt"};
  opt.out_dir = dir / "out";
  opt.shard_tokens = 10;
  prepare_dataset(opt);
  EXPECT_TRUE(fs::exists(dir / "out/train_000008.bin"));
  opt.shard_tokens = 1000;
  prepare_dataset(opt);
  EXPECT_FALSE(fs::exists(dir / "out/train_000001.bin"));
  EXPECT_FALSE(fs::exists(dir / "out/train_000008.bin"));
  const Corpus c = load_corpus_dir(dir / "out");
  EXPECT_EQ(c.train.size() + c.val.size(), 100);
}

TEST(Prepare, InputErrors) {
  TempDir dir;
  PrepareOptions opt;
  opt.out_dir = dir / "out";
  expect_input_error([&] { prepare_dataset(opt); }, {"no input"});

  opt.inputs = {dir / "missing.txt"};
  expect_input_error([&] { prepare_dataset(opt); }, {dir / "missing.txt"});

  write_text(dir / "empty.txt", "");
  opt.inputs = {dir / "empty.txt"};
  expect_input_error([&] { prepare_dataset(opt); }, {"empty corpus"});

  write_text(dir / "one.txt", "x");
  opt.inputs = {dir / "one.txt"};
  expect_input_error([&] { prepare_dataset(opt); }, {"too small"});

  fs::create_directories(dir / "emptydir");
  opt.inputs = {dir / "emptydir"};
  expect_input_error([&] { prepare_dataset(opt); }, {dir / "emptydir"});

  write_text(dir / "two.txt", "xy");
  opt.inputs = {dir / "two.txt"};
  opt.tokenizer = "gpt2";
  opt.tokenizer_dir = dir / "no-tokenizer";
  expect_input_error([&] { prepare_dataset(opt); }, {"no-tokenizer"});

  opt.tokenizer = "byte";
  opt.val_fraction = 1.5;
  expect_input_error([&] { prepare_dataset(opt); }, {"val_fraction"});

  // The smallest corpus that works: one token each side.
  opt.val_fraction = 0.1;
  const auto r = prepare_dataset(opt);
  EXPECT_EQ(r.train_tokens, 1u);
  EXPECT_EQ(r.val_tokens, 1u);
}

// ---------------------------------------------------------------------------------------------
// Corpus

TEST(Corpus, DirectoryErrors) {
  TempDir dir;
  expect_input_error([&] { load_corpus_dir(dir / "absent"); }, {dir / "absent"});
  expect_input_error([&] { load_corpus_dir(dir.str()); }, {dir.str(), "train"});
  write_shard(dir / "train_000000.bin", {1, 2, 3});
  expect_input_error([&] { load_corpus_dir(dir.str()); }, {dir.str(), "val"});
  write_shard(dir / "val_000000.bin", {4});
  EXPECT_NO_THROW(load_corpus_dir(dir.str()));

  write_text(dir / "meta.json", "{ not json");
  expect_input_error([&] { load_corpus_dir(dir.str()); }, {dir / "meta.json"});
  write_text(dir / "meta.json", R"({"tokenizer": "byte", "vocab_size": 3})");
  expect_input_error([&] { load_corpus_dir(dir.str()); }, {"vocab_size 3"});
  fs::remove(dir / "meta.json");

  fs::resize_file(dir / "val_000000.bin", 1000);
  expect_input_error([&] { load_corpus_dir(dir.str()); }, {dir / "val_000000.bin"});
}

TEST(Corpus, InfersTokenizerWithoutMeta) {
  TempDir dir;
  write_shard(dir / "train_000000.bin", {1, 2});
  write_shard(dir / "train_000001.bin", {3, 255});
  write_shard(dir / "val_000000.bin", {4});
  Corpus c = load_corpus_dir(dir.str());
  EXPECT_EQ(c.train.to_vector(), (std::vector<uint32_t>{1, 2, 3, 255}));
  EXPECT_EQ(c.val.to_vector(), (std::vector<uint32_t>{4}));
  EXPECT_EQ(c.tokenizer, "byte");
  EXPECT_EQ(c.vocab_size, 256);

  write_shard(dir / "val_000001.bin", {50256});
  c = load_corpus_dir(dir.str());
  EXPECT_EQ(c.val.to_vector(), (std::vector<uint32_t>{4, 50256}));
  EXPECT_EQ(c.tokenizer, "gpt2");
  EXPECT_EQ(c.vocab_size, 50257);

  write_shard(dir / "val_000002.bin", {60000});
  expect_input_error([&] { load_corpus_dir(dir.str()); }, {"60000"});
}

TEST(Corpus, DefaultCorpusIsDebianLicences) {
  if (!fs::is_directory("/usr/share/common-licenses"))
    GTEST_SKIP() << "/usr/share/common-licenses is absent on this system";
  const Corpus c = load_default_corpus();
  EXPECT_EQ(c.tokenizer, "byte");
  EXPECT_EQ(c.vocab_size, 256);
  ASSERT_GT(c.train.size(), 1000);
  const int64_t total = c.train.size() + c.val.size();
  EXPECT_EQ(c.val.size(), total / 10);
  EXPECT_NE(c.source.find("/usr/share/common-licenses"), std::string::npos);
  EXPECT_NE(c.source.find(fmt::format("{} bytes", total)), std::string::npos);
  // Deterministic: a second load gives the same streams.
  const Corpus again = load_default_corpus();
  EXPECT_EQ(again.train.to_vector(), c.train.to_vector());
  EXPECT_EQ(again.val.to_vector(), c.val.to_vector());
}

// ---------------------------------------------------------------------------------------------
// 32-bit shards, mapped streams, the global order

TEST(Shard, Version2HoldsUint32Tokens) {
  TempDir dir;
  const std::vector<uint32_t> tokens = {0, 65535, 65536, 128255, 4000000000u};
  write_shard(dir / "w.bin", tokens, kShardVersion32);
  EXPECT_EQ(fs::file_size(dir / "w.bin"), 1024u + 4 * tokens.size());
  const std::string raw = read_bytes(dir / "w.bin");
  int32_t header[256];
  std::memcpy(header, raw.data(), sizeof header);
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], 2);
  EXPECT_EQ(header[2], 5);
  EXPECT_EQ(header[3], 4);
  EXPECT_EQ(read_shard(dir / "w.bin"), tokens);
  EXPECT_EQ(Shard(dir / "w.bin").version(), 2);

  // A count that disagrees with the file's size names the file.
  fs::resize_file(dir / "w.bin", 1024 + 4 * 4);
  expect_input_error([&] { Shard(dir / "w.bin"); },
                     {dir / "w.bin", "header says 5 tokens, file holds 4"});
  // Version 1 cannot hold a token >= 65536.
  EXPECT_THROW(write_shard(dir / "n.bin", std::vector<uint32_t>{65536}), Error);
}

TEST(Shard, VersionForVocabulary) {
  EXPECT_EQ(shard_version_for_vocab(256), 1);
  EXPECT_EQ(shard_version_for_vocab(65536), 1);
  EXPECT_EQ(shard_version_for_vocab(65537), 2);
  EXPECT_EQ(shard_version_for_vocab(128256), 2);
  expect_input_error([&] { shard_version_for_vocab((int64_t(1) << 32) + 1); },
                     {"4294967297", "uint32"});
}

TEST(TokenStream, ReadsAcrossShardsAndChecksTheVocabulary) {
  TempDir dir;
  write_shard(dir / "a.bin", {1, 2, 3});
  write_shard(dir / "b.bin", {});
  write_shard(dir / "c.bin", std::vector<uint32_t>{4, 70000, 6}, kShardVersion32);
  TokenStream s = TokenStream::map_files({dir / "a.bin", dir / "b.bin", dir / "c.bin"});
  EXPECT_EQ(s.size(), 6);
  std::vector<int32_t> out(4);
  s.read(1, 4, out.data());
  EXPECT_EQ(out, (std::vector<int32_t>{2, 3, 4, 70000}));
  EXPECT_EQ(s.max_token_sampled(1), 4u);
  EXPECT_EQ(s.max_token_sampled(2), 70000u);
  s.set_vocab(1000);
  s.read(0, 4, out.data());  // tokens below the vocabulary read as before
  expect_input_error([&] { s.read(2, 3, out.data()); }, {dir / "c.bin", "70000", "position 1"});
}

TEST(Corpus, MapsVersion2ShardsAndRefusesTooLargeAVocabulary) {
  TempDir dir;
  write_shard(dir / "train_000000.bin", std::vector<uint32_t>{1, 100000, 3, 4}, kShardVersion32);
  write_shard(dir / "val_000000.bin", std::vector<uint32_t>{5, 6}, kShardVersion32);
  write_text(dir / "meta.json", R"({"tokenizer": "gpt2", "vocab_size": 128256})");
  const Corpus c = load_corpus_dir(dir.str());
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_EQ(c.train.to_vector(), (std::vector<uint32_t>{1, 100000, 3, 4}));

  // A vocabulary beyond uint16 with version-1 shards cannot be what they were written with.
  write_shard(dir / "train_000000.bin", {1, 2, 3, 4});
  write_shard(dir / "val_000000.bin", {5, 6});
  expect_input_error([&] { load_corpus_dir(dir.str()); }, {"vocab_size 128256", "65536"});
}

TEST(GlobalOrder, EveryEpochIsAPermutation) {
  for (int64_t n : {1, 2, 3, 5, 17, 64, 1000, 4097}) {
    const GlobalOrder order(n, 7, 42, true);
    for (int64_t epoch = 0; epoch < 3; ++epoch) {
      std::set<int64_t> seen;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t v = order.at(epoch * n + i);
        ASSERT_GE(v, 0);
        ASSERT_LT(v, n);
        seen.insert(v);
      }
      EXPECT_EQ(int64_t(seen.size()), n) << "n " << n << " epoch " << epoch;
    }
    // item(step, j) is position step*G + j.
    EXPECT_EQ(order.item(3, 2), order.at(3 * 7 + 2));
  }
  // Shuffled: epochs and seeds differ; unshuffled: the identity.
  const GlobalOrder a(1000, 8, 1, true), b(1000, 8, 2, true), plain(1000, 8, 1, false);
  int same_epoch = 0, same_seed = 0, identity = 0;
  for (int64_t i = 0; i < 1000; ++i) {
    same_epoch += a.at(i) == a.at(1000 + i);
    same_seed += a.at(i) == b.at(i);
    identity += a.at(i) == i;
    EXPECT_EQ(plain.at(1000 + i), i);
  }
  EXPECT_LT(same_epoch, 20);
  EXPECT_LT(same_seed, 20);
  EXPECT_LT(identity, 20);
  // Beyond kStoredOrderMax nothing is stored per item (a Feistel permutation): still one
  // permutation per epoch, and an order over 2^40 windows costs what a small one does.
  const int64_t big = GlobalOrder::kStoredOrderMax + 12345;
  const GlobalOrder feistel(big, 512, 3, true);
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    std::vector<bool> seen(size_t(big), false);
    int64_t fixed = 0;
    for (int64_t i = 0; i < big; ++i) {
      const int64_t v = feistel.at(epoch * big + i);
      ASSERT_TRUE(v >= 0 && v < big && !seen[size_t(v)]) << "epoch " << epoch << " item " << i;
      seen[size_t(v)] = true;
      fixed += v == i;
    }
    EXPECT_LT(fixed, 20);
  }
  const GlobalOrder huge(int64_t(1) << 40, 512, 3, true);
  EXPECT_LT(huge.at(123456789), int64_t(1) << 40);
}

// ---------------------------------------------------------------------------------------------
// Mixtures

TEST(Mixture, ParsesSpecsAndRefusesBadWeights) {
  auto one = parse_data_spec("data/a");
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].dir, "data/a");
  EXPECT_EQ(one[0].weight, 1.0);
  auto two = parse_data_spec("data/a:0.7,/x/b:0.3");
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[1].dir, "/x/b");
  EXPECT_EQ(two[1].weight, 0.3);
  // A suffix that is no number belongs to the path.
  EXPECT_EQ(parse_data_spec("c:/data:x")[0].dir, "c:/data:x");
  expect_input_error([] { parse_data_spec("a:0.7,b:-0.3"); }, {"b", "negative", "-0.3"});
  expect_input_error([] { parse_data_spec("a:0,b:0"); }, {"sum to 0"});
  expect_input_error([] { parse_data_spec("a:0.7,b"); }, {"b", "no weight"});
  expect_input_error([] { parse_data_spec("a:inf,b:1"); }, {"a", "finite"});
}

TEST(MixtureOrder, QuotasPerBlockAndEachDatasetInOrder) {
  MixtureOrder m({0.7, 0.3}, 5);
  EXPECT_EQ(m.quotas(), (std::vector<int64_t>{2867, 1229}));  // 0.7 * 4096 = 2867.2
  // Over three blocks every dataset reads its samples 0, 1, 2, ... in order, once each.
  std::vector<int64_t> next(2, 0);
  for (int64_t pos = 0; pos < 3 * kMixBlock; ++pos) {
    const auto [d, k] = m.at(pos);
    ASSERT_EQ(k, next[size_t(d)]++) << "position " << pos;
  }
  EXPECT_EQ(next[0], 3 * 2867);
  EXPECT_EQ(next[1], 3 * 1229);
  // A pure function of (seed, position): a fresh order, visited backwards, agrees; another seed
  // interleaves differently.
  MixtureOrder again({0.7, 0.3}, 5), other({0.7, 0.3}, 6);
  int differ = 0;
  for (int64_t pos = 2 * kMixBlock + 100; pos >= 0; pos -= 7) {
    EXPECT_EQ(again.at(pos), m.at(pos));
    differ += other.at(pos).first != m.at(pos).first;
  }
  EXPECT_GT(differ, 50);
  // One dataset (or zero weight for the rest) is the unmixed order: position pos reads sample pos.
  MixtureOrder single({1.0}, 5), zero({1.0, 0.0}, 5);
  for (int64_t pos : {0, 1, 4095, 4096, 123457}) {
    EXPECT_EQ(single.at(pos), (std::pair<int, int64_t>{0, pos}));
    EXPECT_EQ(zero.at(pos), (std::pair<int, int64_t>{0, pos}));
  }
  // A tiny positive weight still gets a slot.
  EXPECT_EQ(MixtureOrder({1.0, 1e-9}, 1).quotas()[1], 1);
}

}  // namespace
}  // namespace trellis
