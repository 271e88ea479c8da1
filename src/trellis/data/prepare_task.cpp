#include "trellis/data/prepare_task.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <unordered_map>
#include <unordered_set>

#include "trellis/core/atomic_file.h"
#include "trellis/core/error.h"
#include "trellis/core/philox.h"
#include "trellis/data/task_readers.h"
#include "trellis/data/tokenizer.h"
#include "trellis/data/tokenizer_dir.h"

namespace trellis {

namespace fs = std::filesystem;

namespace {

struct Split {
  ExampleSet train, val;
};

std::vector<uint32_t> encode(const Tokenizer& tok, const std::string& text) {
  const std::vector<int> ids = tok.encode(text);
  return {ids.begin(), ids.end()};
}

// The special token that begins and ends sequences: the tokenizer's end-of-text token, or one
// new id after its vocabulary (task_special_token).
void set_token_meta(TaskMeta& m, const Tokenizer& tok, const TaskPrepareOptions& opt) {
  m.tokenizer = tok.kind();
  // SentencePiece's model is in the directory itself; a GPT-2 one is recorded as prepare.cpp does.
  m.tokenizer_dir =
      m.tokenizer == "sentencepiece" ? "" : recorded_tokenizer_dir(opt.tokenizer_dir, opt.out_dir);
  const SpecialToken special = task_special_token(tok);
  m.special_token = special.id;
  m.vocab_size = special.vocab_size;
}

bool trains_sentencepiece(const TaskPrepareOptions& opt) {
  return opt.tokenizer == "sentencepiece" && opt.tokenizer_model.empty();
}

// The tokenizer of the task: SentencePiece's from --tokenizer-model, or trained on `texts` (the
// training split's); model receives its bytes for the directory. Other kinds by name.
std::unique_ptr<Tokenizer> task_tokenizer(const TaskPrepareOptions& opt,
                                          std::vector<std::string_view> texts, std::string& model) {
  if (opt.tokenizer != "sentencepiece") return make_tokenizer(opt.tokenizer, opt.tokenizer_dir);
  const auto lines = lines_of_texts(std::move(texts));
  const std::string what =
      opt.inputs.size() == 1 ? opt.inputs[0] : fmt::format("{} inputs", opt.inputs.size());
  model = prepare_sentencepiece_model(opt.tokenizer_model, opt.sp, *lines, what);
  return make_sentencepiece_tokenizer(model, kSentencePieceFile);
}

bool is_integer(const std::string& s) {
  if (s.empty()) return false;
  const size_t digits = s.size() - (s[0] == '-' ? 1 : 0);
  return digits > 0 && digits <= 18 &&
         std::all_of(s.end() - digits, s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Fisher-Yates with Philox draws: the same permutation on every machine and standard library.
void shuffle(std::vector<size_t>& v, uint64_t seed, uint64_t stream) {
  for (size_t i = v.size(); i-- > 1;) {
    const auto j = std::min(i, size_t(philox_uniform(seed, stream, i) * double(i + 1)));
    std::swap(v[i], v[j]);
  }
}

Split split_by_mask(const ExampleSet& all, const std::vector<char>& val) {
  Split s;
  for (size_t i = 0; i < all.size(); ++i)
    (val[i] ? s.val : s.train).add(all.labels[i], all.source(i), all.target(i));
  return s;
}

int64_t longest(const ExampleSet& set, bool target) {
  size_t n = 0;
  for (size_t i = 0; i < set.size(); ++i)
    n = std::max(n, (target ? set.target(i) : set.source(i)).size());
  return int64_t(n);
}

std::vector<int64_t> per_class(const ExampleSet& set, size_t n_classes) {
  std::vector<int64_t> counts(n_classes, 0);
  for (int32_t l : set.labels) ++counts[size_t(l)];
  return counts;
}

// Refuses early to replace something that is not a task data directory (or empty).
void check_out_dir(const std::string& out) {
  TRELLIS_REQUIRE(!out.empty(), "prepare: no output directory given");
  if (!fs::exists(out)) return;
  TRELLIS_REQUIRE(fs::is_directory(out), "{}: exists and is not a directory", out);
  TRELLIS_REQUIRE(fs::is_empty(out) || is_task_dir(out),
                  "{}: exists and is not a task data directory; refusing to replace it", out);
}

// Writes into OUT.tmp-<pid>, then renames it into place (an old OUT is moved aside first and
// removed after), so OUT is never half-written.
void write_task_dir(const std::string& out, const Split& s, const TaskMeta& meta,
                    const std::string& sp_model) {
  fs::path final_dir = fs::path(out).lexically_normal();
  if (final_dir.filename().empty()) final_dir = final_dir.parent_path();
  const std::string pid = std::to_string(::getpid());
  const fs::path tmp = final_dir.string() + ".tmp-" + pid, old = final_dir.string() + ".old-" + pid;
  std::error_code ec;
  fs::remove_all(tmp, ec);
  try {
    fs::create_directories(tmp);
    write_examples((tmp / "train.examples").string(), s.train);
    write_examples((tmp / "val.examples").string(), s.val);
    write_task_meta(tmp.string(), meta);
    if (!sp_model.empty()) write_file_atomic((tmp / kSentencePieceFile).string(), sp_model);
    if (fs::exists(final_dir)) fs::rename(final_dir, old);
    fs::rename(tmp, final_dir);
    fs::remove_all(old, ec);
  } catch (const fs::filesystem_error& e) {
    fs::remove_all(tmp, ec);
    TRELLIS_REQUIRE(false, "{}: cannot write the task directory: {}", out, e.code().message());
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
}

void finish(TaskPrepareResult& r, const Split& s, const TaskPrepareOptions& opt,
            const std::string& sp_model = {}) {
  TRELLIS_REQUIRE(s.train.size() > 0, "prepare: no training examples");
  TRELLIS_REQUIRE(s.val.size() > 0,
                  "prepare: no validation examples (too few inputs; give --val-input)");
  TaskMeta& m = r.meta;
  m.task = opt.task;
  m.train_examples = int64_t(s.train.size());
  m.val_examples = int64_t(s.val.size());
  const int64_t per = m.feature_dim > 0 ? m.feature_dim : 1;
  m.max_source_len = std::max(longest(s.train, false), longest(s.val, false)) / per;
  m.max_target_len = std::max(longest(s.train, true), longest(s.val, true));
  if (m.task == "classify") {
    r.train_per_class = per_class(s.train, m.classes.size());
    r.val_per_class = per_class(s.val, m.classes.size());
  }
  write_task_dir(opt.out_dir, s, m, sp_model);
}

// ---- classify: texts ----

std::vector<std::pair<std::string, std::vector<TextRecord>>> read_labelled(
    const std::vector<std::string>& files, const TaskPrepareOptions& opt) {
  std::vector<std::pair<std::string, std::vector<TextRecord>>> out;
  for (const auto& f : files)
    out.emplace_back(f, read_classification_file(f, opt.text_column, opt.label_column));
  return out;
}

void classify_texts(const TaskPrepareOptions& opt, TaskPrepareResult& r) {
  TRELLIS_REQUIRE(opt.patch.empty() && opt.class_names.empty(),
                  "prepare: --patch and --class-names apply to idx image directories, not to {}",
                  opt.inputs[0]);
  const auto train_files = read_labelled(opt.inputs, opt);
  const auto val_files = read_labelled(opt.val_inputs, opt);
  std::vector<std::string> labels;
  for (const auto& [path, records] : train_files)
    for (const auto& rec : records) labels.push_back(rec.label);
  TRELLIS_REQUIRE(!labels.empty(), "{}: no examples", opt.inputs[0]);
  r.meta.classes = order_classes(labels);
  TRELLIS_REQUIRE(r.meta.classes.size() >= 2,
                  "{}: every example has the label '{}'; classification needs 2 classes or more",
                  opt.inputs[0], r.meta.classes[0]);
  std::unordered_map<std::string, int32_t> ids;
  for (size_t i = 0; i < r.meta.classes.size(); ++i) ids[r.meta.classes[i]] = int32_t(i);

  // The held-out split depends on the labels alone: drawn first, so that a SentencePiece model
  // learns from the training split only.
  std::vector<int32_t> label_ids;
  for (const auto& [path, records] : train_files)
    for (const auto& rec : records) label_ids.push_back(ids.at(rec.label));
  const bool held_out = opt.val_inputs.empty();
  const std::vector<char> val_mask =
      held_out ? stratified_val_mask(label_ids, ids.size(), opt.val_fraction, opt.seed)
               : std::vector<char>(label_ids.size(), 0);
  std::vector<std::string_view> texts;
  size_t k = 0;
  for (const auto& [path, records] : train_files)
    for (const auto& rec : records)
      if (!val_mask[k++]) texts.push_back(rec.text);
  std::string sp_model;
  const auto tok = task_tokenizer(opt, std::move(texts), sp_model);
  set_token_meta(r.meta, *tok, opt);
  ExampleSet all;
  for (const auto& [path, records] : train_files)
    for (const auto& rec : records) all.add(ids.at(rec.label), encode(*tok, rec.text));
  if (held_out) return finish(r, split_by_mask(all, val_mask), opt, sp_model);
  Split s{std::move(all), {}};
  for (const auto& [path, records] : val_files)
    for (const auto& rec : records) {
      const auto id = ids.find(rec.label);
      TRELLIS_REQUIRE(id != ids.end(), "{}:{}: label '{}' never appears in the training data", path,
                      rec.line, rec.label);
      s.val.add(id->second, encode(*tok, rec.text));
    }
  finish(r, s, opt, sp_model);
}

// ---- classify: idx images ----

std::pair<int, int> parse_patch(const std::string& patch) {
  if (patch.empty()) return {7, 7};
  const size_t x = patch.find('x');
  auto number = [&](const std::string& s) {
    const bool ok = !s.empty() && s.size() <= 4 &&
                    std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
    TRELLIS_REQUIRE(ok && std::stoi(s) > 0, "--patch '{}': expected P (PxP) or HxW, e.g. 7 or 1x28",
                    patch);
    return std::stoi(s);
  };
  if (x == std::string::npos) return {number(patch), number(patch)};
  return {number(patch.substr(0, x)), number(patch.substr(x + 1))};
}

std::vector<std::string> image_class_names(const TaskPrepareOptions& opt, int max_label) {
  std::vector<std::string> names;
  if (opt.class_names.empty()) {
    for (int i = 0; i <= max_label; ++i) names.push_back(std::to_string(i));
    return names;
  }
  size_t pos = 0;
  for (size_t at; (at = opt.class_names.find(',', pos)) != std::string::npos; pos = at + 1)
    names.push_back(opt.class_names.substr(pos, at - pos));
  names.push_back(opt.class_names.substr(pos));
  for (const auto& n : names)
    TRELLIS_REQUIRE(!n.empty(), "--class-names '{}': an empty name", opt.class_names);
  TRELLIS_REQUIRE(int(names.size()) > max_label,
                  "--class-names lists {} names; the labels go up to {}", names.size(), max_label);
  return names;
}

// Each image becomes its patches in row-major patch order, each patch's pixels row-major.
ExampleSet patch_examples(const IdxImages& im, int ph, int pw) {
  ExampleSet set;
  std::vector<uint32_t> src(size_t(im.rows * im.cols));
  for (int64_t i = 0; i < im.count; ++i) {
    const auto* img = reinterpret_cast<const uint8_t*>(im.pixels.data()) + i * im.rows * im.cols;
    size_t k = 0;
    for (int64_t pr = 0; pr < im.rows; pr += ph)
      for (int64_t pc = 0; pc < im.cols; pc += pw)
        for (int64_t y = pr; y < pr + ph; ++y)
          for (int64_t x = pc; x < pc + pw; ++x) src[k++] = img[y * im.cols + x];
    set.add(im.labels[size_t(i)], src);
  }
  return set;
}

void classify_images(const TaskPrepareOptions& opt, TaskPrepareResult& r) {
  TRELLIS_REQUIRE(opt.inputs.size() == 1, "prepare: give one idx directory, not {} inputs",
                  opt.inputs.size());
  TRELLIS_REQUIRE(opt.val_inputs.empty(),
                  "--val-input: an idx directory brings its own test split (t10k-*)");
  const auto [ph, pw] = parse_patch(opt.patch);
  const std::string& dir = opt.inputs[0];
  TRELLIS_REQUIRE(opt.tokenizer != "sentencepiece",
                  "prepare: {} holds images, which have no tokenizer (--tokenizer sentencepiece)",
                  dir);
  TRELLIS_REQUIRE(opt.text_column.empty() && opt.label_column.empty(),
                  "prepare: --text-column and --label-column do not apply to images ({})", dir);
  TRELLIS_REQUIRE(is_idx_dir(dir),
                  "{}: a directory input must hold idx files "
                  "(train-images-idx3-ubyte[.gz])",
                  dir);
  const IdxImages train = read_idx_split(dir, "train"), test = read_idx_split(dir, "t10k");
  TRELLIS_REQUIRE(train.rows == test.rows && train.cols == test.cols,
                  "{}: train images are {}x{}, t10k images {}x{}", dir, train.rows, train.cols,
                  test.rows, test.cols);
  TRELLIS_REQUIRE(train.rows % ph == 0 && train.cols % pw == 0,
                  "--patch {}x{} does not divide the {}x{} images of {}", ph, pw, train.rows,
                  train.cols, dir);
  int max_label = 0;
  for (const auto* im : {&train, &test})
    for (uint8_t l : im->labels) max_label = std::max(max_label, int(l));
  r.meta.classes = image_class_names(opt, max_label);
  TRELLIS_REQUIRE(r.meta.classes.size() >= 2, "{}: every image has label 0", dir);
  r.meta.tokenizer = "none";
  // Images have no tokens; the one embedding row is the special (CLS) token.
  r.meta.vocab_size = 1;
  r.meta.special_token = 0;
  r.meta.feature_dim = ph * pw;
  r.meta.image_height = int(train.rows);
  r.meta.image_width = int(train.cols);
  r.meta.patch_height = ph;
  r.meta.patch_width = pw;
  r.meta.val_split = "test";
  finish(r, Split{patch_examples(train, ph, pw), patch_examples(test, ph, pw)}, opt);
}

// ---- translate ----

// The pairs of `files`; repeated pairs (catalogues share many strings) are skipped and counted.
std::vector<PairRecord> read_pairs(const std::vector<std::string>& files,
                                   std::map<std::string, int64_t>& skipped,
                                   std::vector<std::string>& where) {
  std::vector<PairRecord> pairs;
  std::unordered_set<std::string> seen;
  for (const auto& path : files) {
    const PairFile f = read_translation_file(path);
    for (const auto& [reason, n] : f.skipped) skipped[reason] += n;
    for (const auto& p : f.pairs) {
      if (!seen.insert(p.source + '\0' + p.target).second) {
        ++skipped["duplicate"];
        continue;
      }
      pairs.push_back(p);
      where.push_back(f.where(p));
    }
  }
  return pairs;
}

// Tokenizes pairs [i for keep[i]] into `set`; with --skip-long, over-long pairs are skipped and
// counted, else refused.
void encode_pairs(const std::vector<PairRecord>& pairs, const std::vector<std::string>& where,
                  const std::vector<char>& keep, const Tokenizer& tok,
                  const TaskPrepareOptions& opt, ExampleSet& set,
                  std::map<std::string, int64_t>& skipped) {
  const size_t limit = size_t(opt.max_len - 1);
  for (size_t i = 0; i < pairs.size(); ++i) {
    if (!keep[i]) continue;
    const auto src = encode(tok, pairs[i].source), tgt = encode(tok, pairs[i].target);
    if (src.size() > limit || tgt.size() > limit) {
      const bool source = src.size() > limit;
      TRELLIS_REQUIRE(opt.skip_long,
                      "{}: the pair's {} has {} tokens, more than --max-len {} allows ({} plus "
                      "the end token)",
                      where[i], source ? "source" : "target", source ? src.size() : tgt.size(),
                      opt.max_len, limit);
      ++skipped["longer than --max-len"];
      continue;
    }
    set.add(-1, src, tgt);
  }
}

void translate(const TaskPrepareOptions& opt, TaskPrepareResult& r) {
  TRELLIS_REQUIRE(opt.max_len >= 2, "--max-len {}: must be at least 2", opt.max_len);
  std::vector<std::string> where, val_where;
  const auto pairs = read_pairs(opt.inputs, r.skipped, where);
  TRELLIS_REQUIRE(!pairs.empty(), "prepare: no translation pairs in {} input file(s)",
                  opt.inputs.size());
  const std::vector<char> all(pairs.size(), 1);
  // A SentencePiece model learns from the training pairs only, so a held-out split is drawn
  // before it (and --skip-long then skips from either side); for the other tokenizers it is
  // drawn among the pairs kept, as it always was.
  const bool held_out = opt.val_inputs.empty(), split_first = held_out && trains_sentencepiece(opt);
  std::vector<char> val_mask(pairs.size(), 0);
  if (split_first)
    val_mask =
        stratified_val_mask(std::vector<int32_t>(pairs.size(), 0), 1, opt.val_fraction, opt.seed);
  std::vector<std::string_view> texts;
  for (size_t i = 0; i < pairs.size(); ++i)
    if (!val_mask[i]) {
      texts.push_back(pairs[i].source);
      texts.push_back(pairs[i].target);
    }
  std::string sp_model;
  const auto tok = task_tokenizer(opt, std::move(texts), sp_model);
  set_token_meta(r.meta, *tok, opt);
  if (split_first) {
    Split s;
    std::vector<char> train_mask(pairs.size());
    for (size_t i = 0; i < pairs.size(); ++i) train_mask[i] = !val_mask[i];
    encode_pairs(pairs, where, train_mask, *tok, opt, s.train, r.skipped);
    encode_pairs(pairs, where, val_mask, *tok, opt, s.val, r.skipped);
    return finish(r, s, opt, sp_model);
  }
  ExampleSet set;
  encode_pairs(pairs, where, all, *tok, opt, set, r.skipped);
  TRELLIS_REQUIRE(set.size() > 0, "prepare: no translation pairs in {} input file(s)",
                  opt.inputs.size());
  if (!held_out) {
    Split s{std::move(set), {}};
    const auto val_pairs = read_pairs(opt.val_inputs, r.skipped, val_where);
    encode_pairs(val_pairs, val_where, std::vector<char>(val_pairs.size(), 1), *tok, opt, s.val,
                 r.skipped);
    return finish(r, s, opt, sp_model);
  }
  const std::vector<int32_t> one_class(set.size(), 0);
  finish(r, split_by_mask(set, stratified_val_mask(one_class, 1, opt.val_fraction, opt.seed)), opt,
         sp_model);
}

}  // namespace

std::vector<std::string> order_classes(const std::vector<std::string>& labels) {
  std::vector<std::string> classes(labels);
  std::sort(classes.begin(), classes.end());
  classes.erase(std::unique(classes.begin(), classes.end()), classes.end());
  if (std::all_of(classes.begin(), classes.end(), is_integer))
    std::stable_sort(classes.begin(), classes.end(),
                     [](const auto& a, const auto& b) { return std::stoll(a) < std::stoll(b); });
  return classes;
}

std::vector<char> stratified_val_mask(const std::vector<int32_t>& labels, size_t n_classes,
                                      double fraction, uint64_t seed) {
  std::vector<std::vector<size_t>> members(n_classes);
  for (size_t i = 0; i < labels.size(); ++i) members[size_t(labels[i])].push_back(i);
  std::vector<char> val(labels.size(), 0);
  for (size_t c = 0; c < n_classes; ++c) {
    const size_t n = members[c].size();
    if (n < 2) continue;
    const auto k = std::clamp<size_t>(size_t(std::llround(fraction * double(n))), 1, n - 1);
    shuffle(members[c], seed, c + 1);
    for (size_t j = 0; j < k; ++j) val[members[c][j]] = 1;
  }
  return val;
}

TaskPrepareResult prepare_task_dataset(const TaskPrepareOptions& opt) {
  TRELLIS_REQUIRE(opt.task == "classify" || opt.task == "translate",
                  "prepare: task '{}' is not classify or translate", opt.task);
  TRELLIS_REQUIRE(!opt.inputs.empty(), "prepare: no input files given");
  TRELLIS_REQUIRE(opt.val_fraction > 0.0 && opt.val_fraction < 1.0,
                  "--val-fraction {}: must be in (0, 1)", opt.val_fraction);
  check_out_dir(opt.out_dir);
  for (const auto& in : opt.inputs) TRELLIS_REQUIRE(fs::exists(in), "{}: input not found", in);
  TaskPrepareResult r;
  if (opt.task == "translate")
    translate(opt, r);
  else if (fs::is_directory(opt.inputs[0]))
    classify_images(opt, r);
  else
    classify_texts(opt, r);
  return r;
}

std::string task_summary(const std::string& out_dir, const TaskPrepareResult& r) {
  const TaskMeta& m = r.meta;
  std::string s = fmt::format("trellis: wrote {} ({}): {} train, {} {} examples\n", out_dir, m.task,
                              m.train_examples, m.val_examples, m.val_split);
  if (m.feature_dim > 0)
    s += fmt::format("  inputs: patches of {} pixels; longest {} patches\n", m.feature_dim,
                     m.max_source_len);
  else
    s += fmt::format("  tokenizer {} (vocab {}, special token {}); longest source {} tokens{}\n",
                     m.tokenizer, m.vocab_size, m.special_token, m.max_source_len,
                     m.task == "translate" ? fmt::format(", target {}", m.max_target_len) : "");
  for (size_t c = 0; c < m.classes.size(); ++c)
    s += fmt::format("  class {:>3} {:<24} {:>8} train {:>7} {}\n", c, m.classes[c],
                     r.train_per_class[c], r.val_per_class[c], m.val_split);
  if (!r.skipped.empty()) {
    std::string parts;
    for (const auto& [reason, n] : r.skipped)
      parts += fmt::format("{}{} {}", parts.empty() ? "" : ", ", n, reason);
    s += "  skipped: " + parts + "\n";
  }
  return s;
}

}  // namespace trellis
