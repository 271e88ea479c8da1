// Task data: examples files, the readers of `prepare --task` (CSV, .po, .mo, idx) and the
// stratified held-out split.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "trellis/core/atomic_file.h"
#include "trellis/core/error.h"
#include "trellis/data/examples.h"
#include "trellis/data/prepare_task.h"
#include "trellis/data/task_readers.h"

namespace fs = std::filesystem;

namespace trellis {
namespace {

class TaskTempDir {
 public:
  TaskTempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            fmt::format("trellis_test_task_{}_{}", ::getpid(), info->name());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TaskTempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// Runs f, expecting an input error whose message contains every needle.
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

std::vector<uint32_t> vals(std::span<const uint32_t> s) { return {s.begin(), s.end()}; }

// ---- examples files ----

TEST(TaskExamples, RoundTripAtEachValueWidth) {
  TaskTempDir dir;
  for (const uint32_t top : {200u, 60000u, 70000u}) {
    ExampleSet set;
    set.add(3, std::vector<uint32_t>{1, 2, top});
    set.add(0, std::vector<uint32_t>{top}, std::vector<uint32_t>{5, 6});
    set.add(-1, std::vector<uint32_t>{}, std::vector<uint32_t>{7});
    const std::string path = dir / "x.examples";
    write_examples(path, set);
    const std::string bytes = read_file(path);
    uint32_t width = 0;
    std::memcpy(&width, bytes.data() + 12, 4);
    EXPECT_EQ(width, top < 256 ? 1u : top < 65536 ? 2u : 4u);
    const ExampleSet got = read_examples(path);
    ASSERT_EQ(got.size(), 3u);
    EXPECT_EQ(got.labels, set.labels);
    EXPECT_EQ(vals(got.source(0)), (std::vector<uint32_t>{1, 2, top}));
    EXPECT_EQ(vals(got.target(0)), std::vector<uint32_t>{});
    EXPECT_EQ(vals(got.source(1)), std::vector<uint32_t>{top});
    EXPECT_EQ(vals(got.target(1)), (std::vector<uint32_t>{5, 6}));
    EXPECT_EQ(vals(got.source(2)), std::vector<uint32_t>{});
    EXPECT_EQ(vals(got.target(2)), std::vector<uint32_t>{7});
  }
}

TEST(TaskExamples, CorruptFilesAreRejected) {
  TaskTempDir dir;
  ExampleSet set;
  set.add(1, std::vector<uint32_t>{1, 2, 3});
  set.add(0, std::vector<uint32_t>{4});
  const std::string path = dir / "ok.examples";
  write_examples(path, set);
  const std::string good = read_file(path);
  const std::string bad = dir / "bad.examples";
  write_bytes(bad, good.substr(0, good.size() - 1));
  expect_input_error([&] { read_examples(bad); }, {bad, "index says 4 values"});
  write_bytes(bad, "TRLSEXMQ" + good.substr(8));
  expect_input_error([&] { read_examples(bad); }, {bad, "bad magic"});
  std::string swapped = good;  // ends[1] (3) > ends[2] (4 -> 1): not increasing
  swapped[24 + 8 + 16] = 1;
  write_bytes(bad, swapped);
  expect_input_error([&] { read_examples(bad); }, {bad, "not increasing"});
  // 4-byte values: the last end claiming 2^62 + 4 values makes count * 4 wrap around to the 16
  // bytes the file holds; the check must not be fooled by the overflow.
  set.add(0, std::vector<uint32_t>{70000});
  write_examples(path, set);
  std::string huge = read_file(path);
  ASSERT_EQ(huge.size(), 24u + 12 + 48 + 20);
  const uint64_t wraps = (uint64_t(1) << 62) + 4;
  std::memcpy(huge.data() + 24 + 12 + 40, &wraps, 8);
  huge.resize(huge.size() - 4);  // 16 bytes of values = (2^62 + 4) * 4 mod 2^64
  write_bytes(bad, huge);
  expect_input_error([&] { read_examples(bad); }, {bad});
}

// ---- classification readers ----

TEST(TaskReaders, CsvQuoting) {
  const std::string csv =
      "review,sentiment\r\n"
      "\"Good, really \"\"good\"\"\",positive\r\n"
      "plain,negative\n"
      "\"two\nlines\",positive\n"
      "\n"
      "\"\",negative";
  const auto rows = parse_csv(csv, "x.csv");
  ASSERT_EQ(rows.size(), 5u);
  EXPECT_EQ(rows[0].fields, (std::vector<std::string>{"review", "sentiment"}));
  EXPECT_EQ(rows[1].fields, (std::vector<std::string>{"Good, really \"good\"", "positive"}));
  EXPECT_EQ(rows[1].line, 2);
  EXPECT_EQ(rows[2].line, 3);
  EXPECT_EQ(rows[3].fields, (std::vector<std::string>{"two\nlines", "positive"}));
  EXPECT_EQ(rows[3].line, 4);
  EXPECT_EQ(rows[4].fields, (std::vector<std::string>{"", "negative"}));
  EXPECT_EQ(rows[4].line, 7);
  expect_input_error([] { parse_csv("a,b\nok,1\n\"open,\n1\n2\n", "q.csv"); },
                     {"q.csv:3:", "unterminated"});
  expect_input_error([] { parse_csv("a,b\n\"x\"y,1\n", "q.csv"); }, {"q.csv:2:", "closing quote"});
}

TEST(TaskReaders, ClassificationFiles) {
  TaskTempDir dir;
  write_bytes(dir / "a.tsv", "sentence\tlabel\r\nhello there\t1\r\nbye\t0\r\n");
  auto recs = read_classification_file(dir / "a.tsv");
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(recs[0].text, "hello there");
  EXPECT_EQ(recs[0].label, "1");
  EXPECT_EQ(recs[1].line, 3);
  write_bytes(dir / "b.jsonl",
              "{\"text\": \"x\", \"label\": 2}\n\n{\"text\": \"y\", \"label\": \"b\"}\n");
  recs = read_classification_file(dir / "b.jsonl");
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(recs[0].label, "2");
  EXPECT_EQ(recs[1].label, "b");
  EXPECT_EQ(recs[1].line, 3);
  write_bytes(dir / "c.csv", "id,body,cls\n1,some text,x\n2,more,y\n");
  recs = read_classification_file(dir / "c.csv", "body", "cls");
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(recs[1].text, "more");
  EXPECT_EQ(recs[1].label, "y");
  write_bytes(dir / "d.tsv", "sentence\tlabel\nfine\t1\nno label\t\n");
  expect_input_error([&] { read_classification_file(dir / "d.tsv"); }, {"d.tsv:3:", "no label"});
  write_bytes(dir / "e.tsv", "sentence\tlabel\nfine\t1\n\t0\n");
  expect_input_error([&] { read_classification_file(dir / "e.tsv"); }, {"e.tsv:3:", "empty text"});
}

// ---- translation readers ----

TEST(TaskReaders, PoEntriesEscapesAndSkips) {
  const std::string po =
      "# header comment\n"
      "msgid \"\"\n"
      "msgstr \"\"\n"
      "\"Content-Type: text/plain; charset=UTF-8\\n\"\n"
      "\n"
      "#: src/a.c:1\n"
      "msgid \"Hello\"\n"
      "msgstr \"Hallo\"\n"
      "\n"
      "msgctxt \"menu\"\n"
      "msgid \"\"\n"
      "\"Open \"\n"
      "\"file\"\n"
      "msgstr \"Datei \\\"\\303\\266ffnen\\\"\\n\\tjetzt\\\\\"\n"
      "\n"
      "#, c-format, fuzzy\n"
      "msgid \"Fuzzy %d\"\n"
      "msgstr \"Unscharf %d\"\n"
      "\n"
      "msgid \"one file\"\n"
      "msgid_plural \"%d files\"\n"
      "msgstr[0] \"eine Datei\"\n"
      "msgstr[1] \"%d Dateien\"\n"
      "\n"
      "msgid \"Untranslated\"\n"
      "msgstr \"\"\n"
      "#, c-format\n"
      "msgid \"Last\\x41\"\n"
      "msgstr \"Letzte\"\n"
      "#~ msgid \"Obsolete\"\n"
      "#~ msgstr \"Veraltet\"\n";
  const PairFile f = parse_po(po, "de.po");
  ASSERT_EQ(f.pairs.size(), 3u);
  EXPECT_EQ(f.pairs[0].source, "Hello");
  EXPECT_EQ(f.pairs[0].target, "Hallo");
  EXPECT_EQ(f.pairs[0].line, 7);
  EXPECT_EQ(f.pairs[1].source, "Open file");
  EXPECT_EQ(f.pairs[1].target,
            "Datei \"\xc3\xb6"
            "ffnen\"\n\tjetzt\\");
  EXPECT_EQ(f.pairs[1].line, 11);
  EXPECT_EQ(f.pairs[2].source, "LastA");
  EXPECT_EQ(f.pairs[2].target, "Letzte");
  EXPECT_EQ(f.where(f.pairs[2]), "de.po:28");
  EXPECT_EQ(f.skipped, (std::map<std::string, int64_t>{
                           {"header", 1}, {"fuzzy", 1}, {"plural", 1}, {"untranslated", 1}}));
  expect_input_error([] { parse_po("msgid \"a\"\nmsgstr \"b\\q\"\n", "x.po"); },
                     {"x.po:2:", "unknown escape"});
  expect_input_error([] { parse_po("msgid \"a\"\nmsgstr b\n", "x.po"); }, {"x.po:2:"});
}

void put32(std::string& out, uint32_t v, bool big) {
  if (big) v = __builtin_bswap32(v);
  out.append(reinterpret_cast<const char*>(&v), 4);
}

// A .mo file as msgfmt writes it (no hash table), in either byte order.
std::string make_mo(const std::vector<std::pair<std::string, std::string>>& entries, bool big) {
  const uint32_t n = uint32_t(entries.size()), originals = 28, translations = 28 + 8 * n;
  std::string head, strings;
  put32(head, 0x950412de, big);
  put32(head, 0, big);
  put32(head, n, big);
  put32(head, originals, big);
  put32(head, translations, big);
  put32(head, 0, big);
  put32(head, 28 + 16 * n, big);
  std::string table_o, table_t;
  const uint32_t base = 28 + 16 * n;
  for (int side = 0; side < 2; ++side)
    for (const auto& e : entries) {
      const std::string& s = side == 0 ? e.first : e.second;
      put32(side == 0 ? table_o : table_t, uint32_t(s.size()), big);
      put32(side == 0 ? table_o : table_t, base + uint32_t(strings.size()), big);
      strings += s + '\0';
    }
  return head + table_o + table_t + strings;
}

TEST(TaskReaders, MoBothByteOrders) {
  using namespace std::string_literals;
  const std::vector<std::pair<std::string, std::string>> entries = {
      {"", "Content-Type: text/plain; charset=UTF-8\n"},
      {"Cancel", "Abbrechen"},
      {"menu\x04Open", "Öffnen"},
      {"one file\0%d files"s, "eine Datei\0%d Dateien"s},
      {"Untranslated", ""}};
  for (const bool big : {false, true}) {
    const PairFile f = parse_mo(make_mo(entries, big), "de.mo");
    ASSERT_EQ(f.pairs.size(), 2u) << (big ? "big-endian" : "little-endian");
    EXPECT_EQ(f.pairs[0].source, "Cancel");
    EXPECT_EQ(f.pairs[0].target, "Abbrechen");
    EXPECT_EQ(f.pairs[1].source, "Open");
    EXPECT_EQ(f.pairs[1].target, "Öffnen");
    EXPECT_EQ(f.where(f.pairs[1]), "de.mo:entry 3");
    EXPECT_EQ(f.skipped,
              (std::map<std::string, int64_t>{{"header", 1}, {"plural", 1}, {"untranslated", 1}}));
  }
  expect_input_error([] { parse_mo("msgid \"x\"\nmsgstr \"y\"\n", "t.mo"); },
                     {"t.mo: bad magic 0x", "not a gettext .mo file"});
  std::string cut = make_mo(entries, false);
  cut.resize(cut.size() - 20);
  expect_input_error([&] { parse_mo(cut, "t.mo"); }, {"t.mo:entry 4:", "past the end"});
}

TEST(TaskReaders, TranslationTsv) {
  const PairFile f = parse_translation_tsv("hello\thallo\r\n\nyes\tja\n", "p.tsv");
  ASSERT_EQ(f.pairs.size(), 2u);
  EXPECT_EQ(f.pairs[0].target, "hallo");
  EXPECT_EQ(f.pairs[1].line, 3);
  expect_input_error([] { parse_translation_tsv("a\tb\nc\td\te\n", "p.tsv"); },
                     {"p.tsv:2:", "2 tab(s)"});
  expect_input_error([] { parse_translation_tsv("a\tb\nno tab\n", "p.tsv"); },
                     {"p.tsv:2:", "0 tab(s)"});
}

// ---- idx images ----

std::string be32(uint32_t v) {
  return std::string{char(v >> 24), char(v >> 16), char(v >> 8), char(v)};
}

std::string idx_images(int n, int rows, int cols) {
  std::string b = be32(0x803) + be32(n) + be32(rows) + be32(cols);
  for (int i = 0; i < n * rows * cols; ++i) b += char(i % 251);
  return b;
}

void write_gz(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, bytes.data(), unsigned(bytes.size())), int(bytes.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

TEST(TaskReaders, IdxFiles) {
  const IdxImages im = parse_idx_images(idx_images(3, 4, 2), "i");
  EXPECT_EQ(im.count, 3);
  EXPECT_EQ(im.rows, 4);
  EXPECT_EQ(im.cols, 2);
  EXPECT_EQ(im.pixels.size(), 24u);
  EXPECT_EQ(uint8_t(im.pixels[23]), 23);
  expect_input_error([] { parse_idx_images(idx_images(3, 4, 2) + "x", "imgs"); },
                     {"imgs:", "3 images of 4x2"});
  expect_input_error([] { parse_idx_images(be32(0x801) + be32(0) + be32(1) + be32(1), "imgs"); },
                     {"imgs: bad magic 0x00000801"});
  EXPECT_EQ(parse_idx_labels(be32(0x801) + be32(2) + "\x01\x07", "l"),
            (std::vector<uint8_t>{1, 7}));
  expect_input_error([] { parse_idx_labels(be32(0x801) + be32(3) + "\x01", "labs"); },
                     {"labs:", "3 labels"});

  TaskTempDir dir;
  write_gz(dir / "train-images-idx3-ubyte.gz", idx_images(2, 2, 2));
  write_gz(dir / "train-labels-idx1-ubyte.gz", be32(0x801) + be32(2) + "\x03\x01");
  write_bytes(dir / "t10k-images-idx3-ubyte", idx_images(1, 2, 2));
  write_bytes(dir / "t10k-labels-idx1-ubyte", be32(0x801) + be32(2) + std::string("\x00\x01", 2));
  EXPECT_TRUE(is_idx_dir(dir / ""));
  const IdxImages train = read_idx_split(dir / "", "train");
  EXPECT_EQ(train.count, 2);
  EXPECT_EQ(train.labels, (std::vector<uint8_t>{3, 1}));
  EXPECT_EQ(train.pixels, idx_images(2, 2, 2).substr(16));
  expect_input_error([&] { read_idx_split(dir / "", "t10k"); },
                     {"t10k-labels-idx1-ubyte", "2 labels for the 1 images"});
  // A truncated gzip stream is an error naming the file, not silently short data.
  const std::string gz = read_file(dir / "train-images-idx3-ubyte.gz");
  write_bytes(dir / "train-images-idx3-ubyte.gz", gz.substr(0, gz.size() - 10));
  expect_input_error([&] { read_idx_split(dir / "", "train"); }, {"train-images-idx3-ubyte.gz"});
}

// ---- classes and the held-out split ----

TEST(TaskSplit, ClassOrder) {
  EXPECT_EQ(order_classes({"10", "2", "1", "2", "-3"}),
            (std::vector<std::string>{"-3", "1", "2", "10"}));
  EXPECT_EQ(order_classes({"positive", "negative", "10", "2"}),
            (std::vector<std::string>{"10", "2", "negative", "positive"}));
}

TEST(TaskSplit, StratifiedProportionsPerClass) {
  std::vector<int32_t> labels;
  const std::vector<int> counts = {200, 50, 7, 2, 1};
  for (int i = 0; i < 260; ++i)  // classes interleaved, as in a real file
    for (int c = 0; c < 5; ++c)
      if (i < counts[c]) labels.push_back(c);
  const auto val = stratified_val_mask(labels, 5, 0.1, 1337);
  std::vector<int> held(5, 0);
  for (size_t i = 0; i < labels.size(); ++i) held[labels[i]] += val[i];
  EXPECT_EQ(held, (std::vector<int>{20, 5, 1, 1, 0}));
  EXPECT_EQ(stratified_val_mask(labels, 5, 0.1, 1337), val) << "same seed, same split";
  EXPECT_NE(stratified_val_mask(labels, 5, 0.1, 7), val) << "another seed, another split";
  const auto most = stratified_val_mask(labels, 5, 0.99, 1);
  held.assign(5, 0);
  for (size_t i = 0; i < labels.size(); ++i) held[labels[i]] += most[i];
  EXPECT_EQ(held, (std::vector<int>{198, 49, 6, 1, 0})) << "every class keeps a training example";
}

}  // namespace
}  // namespace trellis
