#pragma once
// Readers of the inputs of `trellis prepare --task classify|translate`: labelled texts (TSV, CSV,
// JSONL), idx image sets (MNIST format), and translation pairs (TSV, gettext .po and .mo). Each
// record keeps where it came from so that errors can name the file and line. A malformed file is
// an input error, one line, "FILE:LINE: what is wrong".
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace trellis {

// ---- classification ----

struct TextRecord {
  std::string text, label;
  int64_t line = 0;  // 1-based line where the record starts
};

// By extension: .tsv (header row; tab-separated, no quoting), .csv (header row; RFC 4180), .jsonl
// or .json (one object per line). Empty columns pick the defaults: the first of "sentence", "text",
// "review" and of "label", "sentiment" in a header; "text" and "label" in JSON. An integer JSON
// label becomes its decimal string.
std::vector<TextRecord> read_classification_file(const std::string& path,
                                                 const std::string& text_column = "",
                                                 const std::string& label_column = "");

// One CSV record: its fields and the line it starts on.
struct CsvRow {
  std::vector<std::string> fields;
  int64_t line = 0;
};
// RFC 4180: fields separated by commas, records by LF or CRLF; a quoted field may hold commas,
// newlines and "" (one quote). `path` only names the input in errors.
std::vector<CsvRow> parse_csv(std::string_view text, const std::string& path);

// ---- images ----

struct IdxImages {
  int64_t count = 0, rows = 0, cols = 0;
  std::string pixels;  // count * rows * cols bytes, image after image, each row-major
  std::vector<uint8_t> labels;
};

// Reads DIR/{prefix}-images-idx3-ubyte and DIR/{prefix}-labels-idx1-ubyte, each gzipped (.gz) or
// not; prefix is "train" or "t10k". Magic numbers, sizes and matching counts are checked.
IdxImages read_idx_split(const std::string& dir, const std::string& prefix);
// The parsers behind it, over a file's (decompressed) bytes.
IdxImages parse_idx_images(std::string_view bytes, const std::string& path);
std::vector<uint8_t> parse_idx_labels(std::string_view bytes, const std::string& path);
// True when DIR holds train-images-idx3-ubyte[.gz].
bool is_idx_dir(const std::string& dir);

// ---- translation ----

struct PairRecord {
  std::string source, target;
  int64_t line = 0;  // 1-based line (.tsv, .po: the msgid's line) or entry number (.mo)
};

struct PairFile {
  std::string path;
  bool entries = false;  // .mo: PairRecord::line counts entries, not lines
  std::vector<PairRecord> pairs;
  std::map<std::string, int64_t> skipped;  // reason -> count (header, plural, fuzzy, untranslated)
  // "FILE:LINE" or, for .mo, "FILE:entry N".
  std::string where(const PairRecord& r) const;
};

// By extension: .tsv (source<TAB>target, no header), .po, .mo.
PairFile read_translation_file(const std::string& path);
PairFile parse_translation_tsv(std::string_view text, const std::string& path);
PairFile parse_po(std::string_view text, const std::string& path);
PairFile parse_mo(std::string_view bytes, const std::string& path);

}  // namespace trellis
