#include "trellis/data/task_readers.h"

#include <zlib.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>

#include "trellis/core/atomic_file.h"
#include "trellis/core/error.h"

namespace trellis {

namespace fs = std::filesystem;

namespace {

std::string extension(const std::string& path) {
  std::string ext = fs::path(path).extension().string();
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return ext;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

std::string_view strip_bom(std::string_view s) {
  if (s.substr(0, 3) == "\xEF\xBB\xBF") s.remove_prefix(3);
  return s;
}

// Calls f(line, number) for each line (1-based), without its '\n' or a trailing '\r'.
template <class F>
void for_each_line(std::string_view text, F&& f) {
  int64_t number = 0;
  for (size_t pos = 0; pos < text.size();) {
    const size_t nl = text.find('\n', pos);
    const size_t end = nl == std::string_view::npos ? text.size() : nl;
    std::string_view line = text.substr(pos, end - pos);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    f(line, ++number);
    pos = end + 1;
  }
}

std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> out;
  for (size_t pos = 0;;) {
    const size_t at = s.find(sep, pos);
    out.emplace_back(
        s.substr(pos, at == std::string_view::npos ? std::string_view::npos : at - pos));
    if (at == std::string_view::npos) return out;
    pos = at + 1;
  }
}

// ---- classification ----

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

// The header's column named `wanted`, or else the first of `defaults` it has.
size_t pick_column(const std::vector<std::string>& header, const std::string& wanted,
                   std::initializer_list<const char*> defaults, const char* what,
                   const std::string& path) {
  auto find = [&](std::string_view name) {
    for (size_t i = 0; i < header.size(); ++i)
      if (trim(header[i]) == name) return i;
    return header.size();
  };
  if (!wanted.empty()) {
    const size_t i = find(wanted);
    TRELLIS_REQUIRE(i < header.size(), "{}:1: no column '{}' in the header ({})", path, wanted,
                    join(header));
    return i;
  }
  for (const char* name : defaults)
    if (const size_t i = find(name); i < header.size()) return i;
  std::vector<std::string> names(defaults.begin(), defaults.end());
  TRELLIS_REQUIRE(false, "{}:1: no {} column: the header ({}) has none of {} (use --{}-column)",
                  path, what, join(header), join(names), what);
  return 0;
}

struct Columns {
  size_t text, label;
  std::string text_name, label_name;
};

Columns header_columns(const std::vector<std::string>& header, const std::string& text_column,
                       const std::string& label_column, const std::string& path) {
  Columns c;
  c.text = pick_column(header, text_column, {"sentence", "text", "review"}, "text", path);
  c.label = pick_column(header, label_column, {"label", "sentiment"}, "label", path);
  c.text_name = header[c.text];
  c.label_name = header[c.label];
  return c;
}

// Checks the row has a label and a non-empty text.
TextRecord make_record(std::vector<std::string>& fields, const Columns& c, const std::string& path,
                       int64_t line) {
  TRELLIS_REQUIRE(c.label < fields.size(),
                  "{}:{}: no label: the row has {} field(s), the label '{}' is field {}", path,
                  line, fields.size(), c.label_name, c.label + 1);
  TRELLIS_REQUIRE(c.text < fields.size(),
                  "{}:{}: no text: the row has {} field(s), the text '{}' is field {}", path, line,
                  fields.size(), c.text_name, c.text + 1);
  const std::string_view label = trim(fields[c.label]);
  TRELLIS_REQUIRE(!label.empty(), "{}:{}: no label (column '{}' is empty)", path, line,
                  c.label_name);
  TRELLIS_REQUIRE(!trim(fields[c.text]).empty(), "{}:{}: empty text (column '{}')", path, line,
                  c.text_name);
  return TextRecord{std::move(fields[c.text]), std::string(label), line};
}

std::vector<TextRecord> read_tsv(std::string_view text, const std::string& path,
                                 const std::string& text_column, const std::string& label_column) {
  std::vector<TextRecord> out;
  std::optional<Columns> cols;
  for_each_line(text, [&](std::string_view line, int64_t number) {
    if (trim(line).empty()) return;
    std::vector<std::string> fields = split(line, '\t');
    if (!cols)
      cols = header_columns(fields, text_column, label_column, path);
    else
      out.push_back(make_record(fields, *cols, path, number));
  });
  TRELLIS_REQUIRE(cols.has_value(), "{}: empty file (expected a header row)", path);
  return out;
}

std::vector<TextRecord> read_csv(std::string_view text, const std::string& path,
                                 const std::string& text_column, const std::string& label_column) {
  std::vector<CsvRow> rows = parse_csv(text, path);
  TRELLIS_REQUIRE(!rows.empty(), "{}: empty file (expected a header row)", path);
  const Columns cols = header_columns(rows[0].fields, text_column, label_column, path);
  std::vector<TextRecord> out;
  out.reserve(rows.size() - 1);
  for (size_t i = 1; i < rows.size(); ++i)
    out.push_back(make_record(rows[i].fields, cols, path, rows[i].line));
  return out;
}

std::vector<TextRecord> read_jsonl(std::string_view text, const std::string& path,
                                   const std::string& text_column,
                                   const std::string& label_column) {
  const std::string tkey = text_column.empty() ? "text" : text_column;
  const std::string lkey = label_column.empty() ? "label" : label_column;
  std::vector<TextRecord> out;
  for_each_line(text, [&](std::string_view line, int64_t number) {
    if (trim(line).empty()) return;
    const auto j = nlohmann::json::parse(line, nullptr, false);
    TRELLIS_REQUIRE(j.is_object(), "{}:{}: not a JSON object", path, number);
    const auto t = j.find(tkey);
    TRELLIS_REQUIRE(t != j.end() && t->is_string(), "{}:{}: no text (no string '{}')", path, number,
                    tkey);
    const auto l = j.find(lkey);
    TRELLIS_REQUIRE(l != j.end() && !l->is_null(), "{}:{}: no label ('{}' is missing)", path,
                    number, lkey);
    TRELLIS_REQUIRE(l->is_string() || l->is_number_integer(),
                    "{}:{}: label '{}' is {}, not a string or an integer", path, number, lkey,
                    l->dump());
    std::string label = l->is_string() ? std::string(trim(l->get<std::string>())) : l->dump();
    TRELLIS_REQUIRE(!label.empty(), "{}:{}: no label ('{}' is empty)", path, number, lkey);
    std::string body = t->get<std::string>();
    TRELLIS_REQUIRE(!trim(body).empty(), "{}:{}: empty text ('{}')", path, number, tkey);
    out.push_back(TextRecord{std::move(body), std::move(label), number});
  });
  return out;
}

// ---- images ----

// The whole file, decompressed when it is gzip (zlib reads plain files as they are).
std::string read_maybe_gz(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  TRELLIS_REQUIRE(f != nullptr, "{}: cannot open: {}", path, std::strerror(errno));
  std::string out;
  char buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  int err = Z_OK;
  const std::string msg = n < 0 ? gzerror(f, &err) : "";
  const int rc = gzclose(f);
  TRELLIS_REQUIRE(n == 0, "{}: cannot read: {}", path, msg);
  TRELLIS_REQUIRE(rc == Z_OK, "{}: truncated or corrupt gzip data", path);
  return out;
}

uint32_t big_endian_u32(std::string_view b, size_t at) {
  const auto* p = reinterpret_cast<const unsigned char*>(b.data() + at);
  return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | uint32_t(p[3]);
}

std::string idx_file(const std::string& dir, const std::string& name) {
  const fs::path plain = fs::path(dir) / name;
  if (fs::exists(plain)) return plain.string();
  const fs::path gz = fs::path(dir) / (name + ".gz");
  TRELLIS_REQUIRE(fs::exists(gz), "{}: no {} or {}.gz", dir, name, name);
  return gz.string();
}

// ---- translation ----

std::string po_unescape(std::string_view s, const std::string& path, int64_t line) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\') {
      out += s[i];
      continue;
    }
    TRELLIS_REQUIRE(i + 1 < s.size(), "{}:{}: string ends with a lone backslash", path, line);
    const char c = s[++i];
    switch (c) {
      case 'n':
        out += '\n';
        break;
      case 't':
        out += '\t';
        break;
      case 'r':
        out += '\r';
        break;
      case 'a':
        out += '\a';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'v':
        out += '\v';
        break;
      case '"':
      case '\\':
      case '\'':
      case '?':
        out += c;
        break;
      case 'x': {
        size_t j = i + 1;
        unsigned v = 0;
        for (; j < s.size() && std::isxdigit(static_cast<unsigned char>(s[j])); ++j)
          v = v * 16 + (std::isdigit(static_cast<unsigned char>(s[j])) ? s[j] - '0'
                                                                       : (s[j] | 0x20) - 'a' + 10);
        TRELLIS_REQUIRE(j > i + 1, "{}:{}: \\x without hex digits", path, line);
        out += static_cast<char>(v & 0xff);
        i = j - 1;
        break;
      }
      default: {
        TRELLIS_REQUIRE(c >= '0' && c <= '7', "{}:{}: unknown escape \\{}", path, line, c);
        unsigned v = 0;
        size_t j = i;
        while (j < s.size() && j < i + 3 && s[j] >= '0' && s[j] <= '7') v = v * 8 + (s[j++] - '0');
        out += static_cast<char>(v & 0xff);
        i = j - 1;
      }
    }
  }
  return out;
}

// `"..."` (the rest of a .po line) -> its unescaped contents.
std::string po_string(std::string_view rest, const std::string& path, int64_t line) {
  rest = trim(rest);
  TRELLIS_REQUIRE(rest.size() >= 2 && rest.front() == '"' && rest.back() == '"',
                  "{}:{}: expected a quoted string", path, line);
  return po_unescape(rest.substr(1, rest.size() - 2), path, line);
}

struct PoEntry {
  std::string ctxt, id, str, ignored;
  bool has_ctxt = false, has_id = false, has_str = false, plural = false, fuzzy = false;
  int64_t line = 0;
};

void add_entry(PairFile& f, const PoEntry& e) {
  if (!e.has_id) return;  // comments only (e.g. trailing obsolete entries)
  TRELLIS_REQUIRE(e.has_str, "{}:{}: msgid without msgstr", f.path, e.line);
  if (e.id.empty() && !e.has_ctxt)
    ++f.skipped["header"];
  else if (e.plural)
    ++f.skipped["plural"];
  else if (e.fuzzy)
    ++f.skipped["fuzzy"];
  else if (e.str.empty())
    ++f.skipped["untranslated"];
  else
    f.pairs.push_back(PairRecord{e.id, e.str, e.line});
}

bool has_fuzzy_flag(std::string_view flags) {
  for (const auto& flag : split(flags, ','))
    if (trim(flag) == "fuzzy") return true;
  return false;
}

}  // namespace

// ---- classification ----

std::vector<CsvRow> parse_csv(std::string_view s, const std::string& path) {
  std::vector<CsvRow> rows;
  CsvRow row{{}, 1};
  std::string field;
  int64_t line = 1;
  bool field_start = true, row_empty = true;
  auto end_row = [&] {
    if (!row_empty) {
      row.fields.push_back(std::move(field));
      rows.push_back(std::move(row));
    }
    row = CsvRow{{}, line};
    field.clear();
    field_start = row_empty = true;
  };
  auto line_end = [&](size_t i) {  // length of the line break at i (LF, CRLF, CR at EOF), or 0
    if (s[i] == '\n') return 1;
    if (s[i] == '\r' && (i + 1 == s.size() || s[i + 1] == '\n')) return i + 1 == s.size() ? 1 : 2;
    return 0;
  };
  for (size_t i = 0; i < s.size();) {
    if (field_start && s[i] == '"') {
      const int64_t start = line;
      for (++i;; ++i) {
        TRELLIS_REQUIRE(i < s.size(), "{}:{}: unterminated quoted field (it starts on this line)",
                        path, start);
        if (s[i] == '"') {
          if (i + 1 < s.size() && s[i + 1] == '"') {
            field += s[++i];
            continue;
          }
          break;
        }
        if (s[i] == '\n') ++line;
        field += s[i];
      }
      ++i;
      TRELLIS_REQUIRE(i == s.size() || s[i] == ',' || line_end(i) > 0,
                      "{}:{}: unexpected character after a closing quote", path, line);
      field_start = row_empty = false;
    } else if (s[i] == ',') {
      row.fields.push_back(std::move(field));
      field.clear();
      field_start = true;
      row_empty = false;
      ++i;
    } else if (const int n = line_end(i); n > 0) {
      ++line;
      end_row();
      i += n;
    } else {
      field += s[i++];
      field_start = row_empty = false;
    }
  }
  end_row();
  return rows;
}

std::vector<TextRecord> read_classification_file(const std::string& path,
                                                 const std::string& text_column,
                                                 const std::string& label_column) {
  const std::string ext = extension(path);
  TRELLIS_REQUIRE(ext == ".tsv" || ext == ".csv" || ext == ".jsonl" || ext == ".json",
                  "{}: unknown classification input type '{}' (expected .tsv, .csv, .jsonl or "
                  ".json)",
                  path, ext);
  const std::string bytes = read_file(path);
  const std::string_view text = strip_bom(bytes);
  if (ext == ".tsv") return read_tsv(text, path, text_column, label_column);
  if (ext == ".csv") return read_csv(text, path, text_column, label_column);
  return read_jsonl(text, path, text_column, label_column);
}

// ---- images ----

IdxImages parse_idx_images(std::string_view b, const std::string& path) {
  TRELLIS_REQUIRE(b.size() >= 16, "{}: too short for an idx3-ubyte header ({} bytes)", path,
                  b.size());
  const uint32_t magic = big_endian_u32(b, 0);
  TRELLIS_REQUIRE(magic == 0x803, "{}: bad magic 0x{:08x}: not an idx3-ubyte image file", path,
                  magic);
  IdxImages im;
  im.count = big_endian_u32(b, 4);
  im.rows = big_endian_u32(b, 8);
  im.cols = big_endian_u32(b, 12);
  const uint64_t body = b.size() - 16, per = uint64_t(im.rows) * uint64_t(im.cols);
  TRELLIS_REQUIRE(per > 0 && uint64_t(im.count) == body / per && body % per == 0,
                  "{}: the header says {} images of {}x{} pixels, the file holds {} pixel bytes",
                  path, im.count, im.rows, im.cols, body);
  im.pixels.assign(b.substr(16));
  return im;
}

std::vector<uint8_t> parse_idx_labels(std::string_view b, const std::string& path) {
  TRELLIS_REQUIRE(b.size() >= 8, "{}: too short for an idx1-ubyte header ({} bytes)", path,
                  b.size());
  const uint32_t magic = big_endian_u32(b, 0);
  TRELLIS_REQUIRE(magic == 0x801, "{}: bad magic 0x{:08x}: not an idx1-ubyte label file", path,
                  magic);
  const uint32_t n = big_endian_u32(b, 4);
  TRELLIS_REQUIRE(b.size() - 8 == n, "{}: the header says {} labels, the file holds {}", path, n,
                  b.size() - 8);
  return std::vector<uint8_t>(b.begin() + 8, b.end());
}

IdxImages read_idx_split(const std::string& dir, const std::string& prefix) {
  const std::string images_path = idx_file(dir, prefix + "-images-idx3-ubyte");
  const std::string labels_path = idx_file(dir, prefix + "-labels-idx1-ubyte");
  IdxImages im = parse_idx_images(read_maybe_gz(images_path), images_path);
  im.labels = parse_idx_labels(read_maybe_gz(labels_path), labels_path);
  TRELLIS_REQUIRE(int64_t(im.labels.size()) == im.count, "{}: {} labels for the {} images of {}",
                  labels_path, im.labels.size(), im.count, images_path);
  return im;
}

bool is_idx_dir(const std::string& dir) {
  const fs::path p = fs::path(dir) / "train-images-idx3-ubyte";
  return fs::is_directory(dir) && (fs::exists(p) || fs::exists(p.string() + ".gz"));
}

// ---- translation ----

std::string PairFile::where(const PairRecord& r) const {
  return entries ? fmt::format("{}:entry {}", path, r.line) : fmt::format("{}:{}", path, r.line);
}

PairFile parse_translation_tsv(std::string_view text, const std::string& path) {
  PairFile f;
  f.path = path;
  for_each_line(text, [&](std::string_view line, int64_t number) {
    if (trim(line).empty()) return;  // blank lines separate nothing; skip them
    const auto fields = split(line, '\t');
    TRELLIS_REQUIRE(fields.size() == 2, "{}:{}: expected source<TAB>target, found {} tab(s)", path,
                    number, fields.size() - 1);
    TRELLIS_REQUIRE(!trim(fields[0]).empty(), "{}:{}: empty source text", path, number);
    TRELLIS_REQUIRE(!trim(fields[1]).empty(), "{}:{}: empty target text", path, number);
    f.pairs.push_back(PairRecord{fields[0], fields[1], number});
  });
  return f;
}

PairFile parse_po(std::string_view text, const std::string& path) {
  PairFile f;
  f.path = path;
  PoEntry e;
  std::string* target = nullptr;  // where continuation lines ("...") append
  auto flush = [&] {
    add_entry(f, e);
    e = PoEntry{};
    target = nullptr;
  };
  for_each_line(text, [&](std::string_view raw, int64_t number) {
    const std::string_view line = trim(raw);
    if (line.empty()) return flush();
    if (line.front() == '#') {
      if (e.has_str) flush();  // a comment after msgstr starts the next entry
      if (line.substr(0, 2) == "#,") e.fuzzy = e.fuzzy || has_fuzzy_flag(line.substr(2));
      target = nullptr;
      return;
    }
    if (line.front() == '"') {
      TRELLIS_REQUIRE(target != nullptr, "{}:{}: a string outside msgid/msgstr", path, number);
      *target += po_string(line, path, number);
      return;
    }
    const size_t space = line.find_first_of(" \t");
    const std::string_view key = line.substr(0, space);
    const std::string value =
        po_string(space == std::string_view::npos ? "" : line.substr(space), path, number);
    if (key == "msgctxt" || key == "msgid") {
      if (e.has_id) flush();
      if (key == "msgctxt") {
        e.has_ctxt = true;
        target = &(e.ctxt = value);
      } else {
        e.has_id = true;
        e.line = number;
        target = &(e.id = value);
      }
      return;
    }
    TRELLIS_REQUIRE(e.has_id, "{}:{}: {} before msgid", path, number, key);
    if (key == "msgid_plural") {
      e.plural = true;
      target = &(e.ignored = value);
    } else if (key == "msgstr") {
      e.has_str = true;
      target = &(e.str = value);
    } else {
      TRELLIS_REQUIRE(key.substr(0, 7) == "msgstr[" && e.plural, "{}:{}: unexpected keyword '{}'",
                      path, number, key);
      e.has_str = true;
      target = &(e.ignored = value);
    }
  });
  flush();
  return f;
}

PairFile parse_mo(std::string_view b, const std::string& path) {
  PairFile f;
  f.path = path;
  f.entries = true;
  TRELLIS_REQUIRE(b.size() >= 4, "{}: {} bytes: not a gettext .mo file", path, b.size());
  uint32_t magic;
  std::memcpy(&magic, b.data(), 4);
  const bool swap = magic == 0xde120495;
  TRELLIS_REQUIRE(magic == 0x950412de || swap, "{}: bad magic 0x{:08x}: not a gettext .mo file",
                  path, magic);
  auto u32 = [&](uint64_t at) {
    TRELLIS_REQUIRE(at + 4 <= b.size(), "{}: truncated: offset {} is past the end ({} bytes)", path,
                    at, b.size());
    uint32_t v;
    std::memcpy(&v, b.data() + at, 4);
    return swap ? __builtin_bswap32(v) : v;
  };
  TRELLIS_REQUIRE(b.size() >= 28, "{}: truncated .mo header ({} bytes)", path, b.size());
  const uint32_t revision = u32(4), n = u32(8), originals = u32(12), translations = u32(16);
  TRELLIS_REQUIRE(revision >> 16 <= 1, "{}: unsupported .mo revision 0x{:08x}", path, revision);
  auto string_at = [&](uint64_t table, uint32_t i) {
    const uint32_t len = u32(table + 8ull * i), off = u32(table + 8ull * i + 4);
    TRELLIS_REQUIRE(uint64_t(off) + len <= b.size(),
                    "{}:entry {}: string at {}+{} runs past the end ({} bytes)", path, i + 1, off,
                    len, b.size());
    return b.substr(off, len);
  };
  for (uint32_t i = 0; i < n; ++i) {
    std::string_view id = string_at(originals, i);
    const std::string_view str = string_at(translations, i);
    const size_t eot = id.find('\x04');  // "context\x04msgid"
    if (eot != std::string_view::npos) id.remove_prefix(eot + 1);
    if (id.empty() && eot == std::string_view::npos)
      ++f.skipped["header"];
    else if (id.find('\0') != std::string_view::npos)  // "singular\0plural"
      ++f.skipped["plural"];
    else if (str.empty())
      ++f.skipped["untranslated"];
    else
      f.pairs.push_back(PairRecord{std::string(id), std::string(str), int64_t(i) + 1});
  }
  return f;
}

PairFile read_translation_file(const std::string& path) {
  const std::string ext = extension(path);
  TRELLIS_REQUIRE(ext == ".tsv" || ext == ".po" || ext == ".mo",
                  "{}: unknown translation input type '{}' (expected .tsv, .po or .mo)", path, ext);
  const std::string bytes = read_file(path);
  if (ext == ".mo") return parse_mo(bytes, path);
  if (ext == ".po") return parse_po(strip_bom(bytes), path);
  return parse_translation_tsv(strip_bom(bytes), path);
}

}  // namespace trellis
