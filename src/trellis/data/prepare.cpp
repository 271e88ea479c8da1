#include "trellis/data/prepare.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <span>
#include <thread>

#include "trellis/core/atomic_file.h"
#include "trellis/core/error.h"
#include "trellis/data/doc_index.h"
#include "trellis/data/shard.h"
#include "trellis/data/tokenizer.h"
#include "trellis/data/tokenizer_dir.h"

namespace trellis {

namespace fs = std::filesystem;

namespace {

constexpr size_t kHeaderBytes = kShardHeaderInts * sizeof(int32_t);
constexpr size_t kIoBytes = size_t(1) << 20;  // write buffer and copy block

// Inputs in a fixed order (directories sorted by name) so the same inputs always give the same
// token stream, whatever order the file system lists them in.
std::vector<std::string> collect_input_files(const std::vector<std::string>& inputs) {
  TRELLIS_REQUIRE(!inputs.empty(), "prepare: no input files given");
  std::vector<std::string> files;
  for (const auto& in : inputs) {
    std::error_code ec;
    const auto st = fs::status(in, ec);
    TRELLIS_REQUIRE(fs::exists(st), "{}: input not found", in);
    if (fs::is_directory(st)) {
      std::vector<std::string> inside;
      for (fs::directory_iterator it(in, ec), end; !ec && it != end; it.increment(ec))
        if (it->is_regular_file()) inside.push_back(it->path().string());
      TRELLIS_REQUIRE(!ec, "{}: cannot list input directory: {}", in, ec.message());
      TRELLIS_REQUIRE(!inside.empty(), "{}: input directory holds no regular files", in);
      std::sort(inside.begin(), inside.end());
      files.insert(files.end(), inside.begin(), inside.end());
    } else {
      TRELLIS_REQUIRE(fs::is_regular_file(st), "{}: input is not a regular file or directory", in);
      files.push_back(in);
    }
  }
  return files;
}

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    TRELLIS_REQUIRE(w > 0, "{}: write failed: {}", path, std::strerror(errno));
    p += w;
    n -= size_t(w);
  }
}

// A shard file written in pieces: header placeholder, tokens through a buffer, header at close.
class ShardWriter {
 public:
  ShardWriter(std::string path, int32_t version) : path_(std::move(path)), version_(version) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    TRELLIS_REQUIRE(fd_ >= 0, "{}: cannot create: {}", path_, std::strerror(errno));
    buf_.assign(kHeaderBytes, 0);
  }
  ~ShardWriter() {
    if (fd_ >= 0) ::close(fd_);
  }
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  void push(const uint32_t* t, size_t n) {
    const size_t old = buf_.size();
    if (version_ == kShardVersion16) {
      buf_.resize(old + 2 * n);
      uint8_t* p = buf_.data() + old;
      uint32_t any = 0;
      for (size_t i = 0; i < n; ++i) {
        any |= t[i];
        const auto v = uint16_t(t[i]);
        std::memcpy(p + 2 * i, &v, 2);
      }
      for (size_t i = 0; any > 0xffff && i < n; ++i)
        TRELLIS_REQUIRE(t[i] <= 0xffff, "{}: token {} does not fit a version-1 (uint16) shard",
                        path_, t[i]);
    } else {
      buf_.resize(old + 4 * n);
      if (n > 0) std::memcpy(buf_.data() + old, t, 4 * n);
    }
    if (buf_.size() >= kIoBytes) flush();
    count_ += int64_t(n);
  }
  int64_t count() const { return count_; }
  void close() {
    flush();
    TRELLIS_REQUIRE(count_ <= INT32_MAX, "{}: {} tokens do not fit one shard", path_, count_);
    int32_t h[kShardHeaderInts] = {};
    h[0] = kShardMagic;
    h[1] = version_;
    h[2] = int32_t(count_);
    if (version_ == kShardVersion32) h[3] = 4;
    TRELLIS_REQUIRE(::pwrite(fd_, h, kHeaderBytes, 0) == ssize_t(kHeaderBytes),
                    "{}: write failed: {}", path_, std::strerror(errno));
    TRELLIS_REQUIRE(::close(fd_) == 0, "{}: close failed: {}", path_, std::strerror(errno));
    fd_ = -1;
  }

 private:
  void flush() {
    write_all(fd_, buf_.data(), buf_.size(), path_);
    buf_.clear();
  }
  std::string path_;
  int32_t version_;
  int fd_ = -1;
  int64_t count_ = 0;
  std::vector<uint8_t> buf_;
};

// The token stream spooled into files of S tokens each (shard format) in the staging directory.
class Spool {
 public:
  Spool(std::string dir, int64_t S, int32_t version) : dir_(std::move(dir)), S_(S), v_(version) {}
  void push(const uint32_t* t, size_t n) {
    while (n > 0) {
      if (!cur_) {
        paths_.push_back(fmt::format("{}/spool_{:06d}.bin", dir_, paths_.size()));
        cur_ = std::make_unique<ShardWriter>(paths_.back(), v_);
      }
      const size_t k = std::min<size_t>(n, size_t(S_ - cur_->count()));
      cur_->push(t, k);
      t += k;
      n -= k;
      total_ += int64_t(k);
      if (cur_->count() == S_) close_current();
    }
  }
  void finish() {
    if (cur_) close_current();
  }
  int64_t total() const { return total_; }
  const std::string& path(size_t k) const { return paths_[k]; }
  // Tokens [begin, begin + n) into out.
  void read(int64_t begin, int64_t n, uint32_t* out) const {
    const size_t w = v_ == kShardVersion16 ? 2 : 4;
    std::vector<uint8_t> raw;
    while (n > 0) {
      const size_t k = size_t(begin / S_);
      const int64_t off = begin % S_, m = std::min(n, S_ - off);
      raw.resize(size_t(m) * w);
      const int fd = ::open(paths_[k].c_str(), O_RDONLY | O_CLOEXEC);
      TRELLIS_REQUIRE(fd >= 0, "{}: cannot open: {}", paths_[k], std::strerror(errno));
      size_t got = 0;
      while (got < raw.size()) {
        const ssize_t r = ::pread(fd, raw.data() + got, raw.size() - got,
                                  off_t(kHeaderBytes + size_t(off) * w + got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += size_t(r);
      }
      ::close(fd);
      TRELLIS_REQUIRE(got == raw.size(), "{}: short read", paths_[k]);
      for (int64_t i = 0; i < m; ++i) {
        if (w == 2) {
          uint16_t v;
          std::memcpy(&v, raw.data() + 2 * i, 2);
          out[i] = v;
        } else {
          std::memcpy(out + i, raw.data() + 4 * i, 4);
        }
      }
      out += m;
      begin += m;
      n -= m;
    }
  }

 private:
  void close_current() {
    cur_->close();
    cur_.reset();
  }
  std::string dir_;
  int64_t S_;
  int32_t v_;
  std::vector<std::string> paths_;
  std::unique_ptr<ShardWriter> cur_;
  int64_t total_ = 0;
};

// A progress line on stderr: bytes read of the total, MB/s, tokens so far, ETA.
class Progress {
 public:
  Progress(int mode, uint64_t total_bytes) : total_(total_bytes) {
    tty_ = isatty(STDERR_FILENO) != 0;
    mode_ = mode < 0 ? (tty_ ? 1 : 2) : mode;  // 2: a plain line every 30 s
    t0_ = last_ = Clock::now();
  }
  void update(uint64_t bytes, int64_t tokens, bool done = false) {
    if (mode_ == 0) return;
    const auto now = Clock::now();
    const double since = std::chrono::duration<double>(now - last_).count();
    if (!done && since < (mode_ == 1 ? 0.25 : 30.0)) return;
    if (done && !printed_) return;  // a quick run prints nothing
    last_ = now;
    const double s = std::chrono::duration<double>(now - t0_).count();
    const double rate = s > 0 ? double(bytes) / s : 0.0;
    const double eta = rate > 0 ? double(total_ - std::min(total_, bytes)) / rate : 0.0;
    const std::string line = fmt::format(
        "prepare: {:.1f} of {:.1f} MB ({:.0f}%), {:.1f} MB/s, {} tokens, ETA {}:{:02d}",
        double(bytes) / 1e6, double(total_) / 1e6,
        total_ ? 100.0 * double(bytes) / double(total_) : 100.0, rate / 1e6, tokens,
        int(eta) / 60, int(eta) % 60);
    if (mode_ == 1)
      fmt::print(stderr, "\r{}\033[K{}", line, done ? "\n" : "");
    else
      fmt::print(stderr, "{}\n", line);
    std::fflush(stderr);
    printed_ = true;
  }

 private:
  using Clock = std::chrono::steady_clock;
  uint64_t total_;
  bool tty_ = false, printed_ = false;
  int mode_;
  Clock::time_point t0_, last_;
};

// Where a chunk of GPT-2 text may end without changing its pre-tokens: before a space that
// follows a printable ASCII character and precedes an ASCII letter. The pattern's pieces never
// end in such a space nor start after it (" ?\p{L}+" starts there), and it has no look-behind,
// so encoding the two sides separately gives the tokens of encoding them together. Returns the
// last such position in text[0, n), or 0.
size_t safe_cut(const std::string& text) {
  auto printable = [](unsigned char c) { return c > 0x20 && c < 0x7f; };
  auto letter = [](unsigned char c) { return (c | 0x20) >= 'a' && (c | 0x20) <= 'z'; };
  for (size_t p = text.size() >= 2 ? text.size() - 2 : 0; p >= 1; --p)
    if (text[p] == ' ' && letter(text[p + 1]) && printable(text[p - 1])) return p;
  return 0;
}

// Where a chunk of text may end for a tokenizer that encodes line by line (SentencePiece): after
// the last newline. Returns 0 when there is none.
size_t line_cut(const std::string& text) {
  const size_t nl = text.rfind('\n');
  return nl == std::string::npos ? 0 : nl + 1;
}

// A cut at a UTF-8 character boundary at or before n (the fallback for text without a safe cut).
size_t char_cut(const std::string& text, size_t n) {
  while (n > 0 && n < text.size() && (static_cast<unsigned char>(text[n]) & 0xC0) == 0x80) --n;
  return n > 0 ? n : text.size();
}

// Appends up to n bytes of fd to buf and returns how many came: fewer only at the end of the file.
// Reads a signal interrupts are retried and short reads continued, so where a chunk ends depends
// on the file alone, never on how the kernel split the reads; a read error throws.
size_t read_up_to(int fd, std::string& buf, size_t n, const std::string& path) {
  const size_t old = buf.size();
  buf.resize(old + n);
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::read(fd, buf.data() + old + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    TRELLIS_REQUIRE(r >= 0, "{}: read failed: {}", path, std::strerror(errno));
    if (r == 0) break;
    got += size_t(r);
  }
  buf.resize(old + got);
  return got;
}

void check_options(const PrepareOptions& opt) {
  TRELLIS_REQUIRE(!opt.out_dir.empty(), "prepare: no output directory given");
  TRELLIS_REQUIRE(opt.val_fraction > 0.0 && opt.val_fraction < 1.0,
                  "prepare: val_fraction must be in (0, 1), got {}", opt.val_fraction);
  TRELLIS_REQUIRE(opt.shard_tokens > 0 && opt.shard_tokens <= size_t(INT32_MAX),
                  "prepare: shard_tokens must be in [1, {}], got {}", INT32_MAX, opt.shard_tokens);
  TRELLIS_REQUIRE(opt.threads >= 1 && opt.threads <= 256, "prepare: threads must be >= 1, got {}",
                  opt.threads);
  TRELLIS_REQUIRE(opt.chunk_bytes >= 1, "prepare: chunk_bytes must be >= 1");
}

// One tokenizer per thread, and the SentencePiece model they were made from (else empty).
struct Tokenizers {
  std::vector<std::unique_ptr<Tokenizer>> per_thread;
  std::string sp_model;
  bool sentencepiece = false;
  // The byte tokenizer is a copy: chunks could be cut anywhere and one thread is plenty.
  bool bpe() const { return per_thread[0]->kind() != "byte"; }
  const Tokenizer& first() const { return *per_thread[0]; }
};

Tokenizers make_tokenizers(const PrepareOptions& opt, const std::vector<std::string>& files) {
  // SentencePiece: the model first (trained on the input, a first pass over it), then every
  // thread's tokenizer from its bytes.
  Tokenizers t;
  t.sentencepiece = opt.tokenizer == "sentencepiece";
  if (t.sentencepiece) {
    const auto lines = lines_of_files(files);
    t.sp_model = prepare_sentencepiece_model(
        opt.tokenizer_model, opt.sp, *lines,
        opt.inputs.size() == 1 ? opt.inputs[0] : fmt::format("{} inputs", opt.inputs.size()));
  }
  auto make = [&] {
    return t.sentencepiece ? make_sentencepiece_tokenizer(t.sp_model, kSentencePieceFile)
                           : make_tokenizer(opt.tokenizer, opt.tokenizer_dir);
  };
  t.per_thread.push_back(make());
  const int threads = t.bpe() ? opt.threads : 1;
  while (int(t.per_thread.size()) < threads) t.per_thread.push_back(make());
  return t;
}

uint64_t total_file_bytes(const std::vector<std::string>& files) {
  uint64_t total = 0;
  for (const auto& f : files) {
    std::error_code ec;
    const auto n = fs::file_size(f, ec);
    if (!ec) total += n;
  }
  return total;
}

// The staging directory inside out_dir. Until publish, out_dir keeps what it had: destroying the
// stage removes it (and an output directory this run created).
class Stage {
 public:
  explicit Stage(const std::string& out_dir) : out_(out_dir) {
    std::error_code ec;
    created_ = !fs::exists(out_dir, ec);
    fs::create_directories(out_dir, ec);
    TRELLIS_REQUIRE(!ec, "{}: cannot create output directory: {}", out_dir, ec.message());
    dir_ = (fs::path(out_dir) / fmt::format(".prepare-{}.tmp", ::getpid())).string();
    fs::remove_all(dir_, ec);
    fs::create_directory(dir_, ec);
    TRELLIS_REQUIRE(!ec, "{}: cannot create: {}", dir_, ec.message());
  }
  ~Stage() {
    std::error_code e;
    fs::remove_all(dir_, e);
    if (!published_ && created_) fs::remove(out_, e);
  }
  Stage(const Stage&) = delete;
  Stage& operator=(const Stage&) = delete;

  const std::string& dir() const { return dir_; }
  std::string path(const std::string& name) const { return (fs::path(dir_) / name).string(); }
  // The named files into out_dir (each rename atomic); from here on out_dir is this run's.
  void publish(const std::vector<std::string>& names) {
    std::error_code ec;
    for (const auto& name : names) {
      fs::rename(fs::path(dir_) / name, fs::path(out_) / name, ec);
      TRELLIS_REQUIRE(!ec, "{}: cannot move into place: {}", (fs::path(out_) / name).string(),
                      ec.message());
    }
    published_ = true;
  }

 private:
  std::string out_, dir_;
  bool created_ = false, published_ = false;
};

struct Piece {
  std::string text;
  bool opens_doc = false;  // the first piece of a document
};

// Pieces of text tokenised a batch at a time, one piece per thread, and spooled in input order
// (so the output does not depend on the thread count), with a separator between documents.
class PieceEncoder {
 public:
  PieceEncoder(const Tokenizers& toks, Spool& spool)
      : toks_(toks), spool_(spool), encoded_(toks.per_thread.size()) {}
  void add(std::string text, bool opens_doc) {
    batch_.push_back({std::move(text), opens_doc});
    if (batch_.size() == toks_.per_thread.size()) run_batch();
  }
  void finish() {
    if (!batch_.empty()) run_batch();
  }
  const std::vector<int64_t>& doc_starts() const { return doc_starts_; }

 private:
  void run_batch() {
    if (batch_.size() == 1) {
      encoded_[0] = toks_.per_thread[0]->encode(batch_[0].text);
    } else {
      std::vector<std::thread> pool;
      std::exception_ptr err;
      std::mutex m;
      for (size_t i = 1; i < batch_.size(); ++i)
        pool.emplace_back([&, i] {
          try {
            encoded_[i] = toks_.per_thread[i]->encode(batch_[i].text);
          } catch (...) {
            std::lock_guard<std::mutex> g(m);
            if (!err) err = std::current_exception();
          }
        });
      encoded_[0] = toks_.per_thread[0]->encode(batch_[0].text);
      for (auto& t : pool) t.join();
      if (err) std::rethrow_exception(err);
    }
    for (size_t i = 0; i < batch_.size(); ++i) emit(batch_[i], encoded_[i]);
    batch_.clear();
  }
  void emit(const Piece& p, const std::vector<int>& ids) {
    if (p.opens_doc) {
      doc_starts_.push_back(spool_.total());
      if (doc_starts_.size() > 1 && toks_.first().eot_token() >= 0) {
        // A separator between documents tells the model where one text ends and the next begins.
        const auto eot = uint32_t(toks_.first().eot_token());
        spool_.push(&eot, 1);
      }
    }
    static_assert(sizeof(int) == sizeof(uint32_t));  // ids are >= 0: the same bits
    spool_.push(reinterpret_cast<const uint32_t*>(ids.data()), ids.size());
  }
  const Tokenizers& toks_;
  Spool& spool_;
  std::vector<Piece> batch_;
  std::vector<std::vector<int>> encoded_;
  std::vector<int64_t> doc_starts_;  // stream positions (one per document: per input file)
};

// Reads one input file in chunks, each cut where the tokenizer would cut anyway, and hands every
// piece to `add` (its first piece opens a document). bytes_done counts what was read.
template <class AddPiece>
void read_in_pieces(const std::string& f, const PrepareOptions& opt, const Tokenizers& toks,
                    uint64_t& bytes_done, AddPiece&& add) {
  const int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
  TRELLIS_REQUIRE(fd >= 0, "{}: cannot read: {}", f, std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  const bool bpe = toks.bpe();
  // A chunk, a little past it for GPT-2, to find a cut.
  const size_t want = opt.chunk_bytes + (bpe ? 1 : 0);
  // Reads n more bytes (fewer: the end of the file).
  auto read_more = [&](std::string& buf, size_t n) {
    const size_t got = read_up_to(fd, buf, n, f);
    bytes_done += got;
    return got == n;
  };
  std::string buf;
  bool first = true, eof = false;
  while (!eof || !buf.empty()) {
    if (!eof && buf.size() < want) eof = !read_more(buf, want - buf.size());
    if (buf.empty()) break;
    size_t cut = buf.size();
    if (!eof && bpe) {
      cut = toks.sentencepiece ? line_cut(buf) : safe_cut(buf);
      if (cut == 0) {
        // No safe cut yet: read on, up to 4 chunks; then cut at a character boundary (this one
        // place may tokenise differently from whole-file encoding: text without spaces).
        if (buf.size() < 4 * opt.chunk_bytes) {
          eof = !read_more(buf, opt.chunk_bytes);
          continue;
        }
        cut = char_cut(buf, opt.chunk_bytes);
      }
    }
    add(buf.substr(0, cut), first);
    buf.erase(0, cut);
    first = false;
  }
}

// The spooled stream [0, n_train) as train shards and the rest as val shards, each with its
// document index, into the stage under their final names; returns those names.
std::vector<std::string> write_split(const Stage& stage, const Spool& spool,
                                     const std::vector<int64_t>& doc_starts, int64_t n_train,
                                     int64_t S, int32_t version) {
  std::vector<std::string> written;
  auto index = [&](const std::string& name, int64_t b, int64_t e) {
    std::vector<uint32_t> rel;
    auto it = std::lower_bound(doc_starts.begin(), doc_starts.end(), b);
    for (; it != doc_starts.end() && *it < e; ++it) rel.push_back(uint32_t(*it - b));
    const std::string idx = name.substr(0, name.size() - 4) + ".idx";
    write_doc_index(stage.path(idx), rel, e - b);
    written.push_back(idx);
  };
  std::vector<uint32_t> block;
  auto copy = [&](const std::string& name, int64_t b, int64_t e) {
    ShardWriter w(stage.path(name), version);
    for (int64_t pos = b; pos < e;) {
      const int64_t n = std::min<int64_t>(e - pos, int64_t(kIoBytes / 4));
      block.resize(size_t(n));
      spool.read(pos, n, block.data());
      w.push(block.data(), block.size());
      pos += n;
    }
    w.close();
  };
  for (int64_t k = 0, b = 0; b < n_train; ++k, b += S) {
    const int64_t e = std::min(n_train, b + S);
    const std::string name = fmt::format("train_{:06d}.bin", k);
    if (e - b == S)  // a whole spool file
      fs::rename(spool.path(size_t(k)), stage.path(name));
    else
      copy(name, b, e);
    written.push_back(name);
    index(name, b, e);
  }
  const int64_t total = spool.total();
  for (int64_t k = 0, b = n_train; b < total; ++k, b += S) {
    const int64_t e = std::min(total, b + S);
    const std::string name = fmt::format("val_{:06d}.bin", k);
    copy(name, b, e);
    written.push_back(name);
    index(name, b, e);
  }
  return written;
}

// Shards left over from an earlier, larger prepare into the same directory would be picked up
// by load_corpus_dir and silently mix two corpora; remove exactly those we did not rewrite.
// So is an earlier prepare's tokenizer.model, which would disagree with this one's tokenizer.
void remove_stale_outputs(const std::string& out_dir, const std::vector<std::string>& written) {
  static const std::regex shard_name(R"((train|val)_\d{6}\.(bin|idx)|tokenizer\.model)");
  for (const auto& e : fs::directory_iterator(out_dir)) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file() && std::regex_match(name, shard_name) &&
        std::find(written.begin(), written.end(), name) == written.end())
      fs::remove(e.path());
  }
}

}  // namespace

PrepareResult prepare_dataset(const PrepareOptions& opt) {
  check_options(opt);
  const auto files = collect_input_files(opt.inputs);
  const Tokenizers toks = make_tokenizers(opt, files);
  const Tokenizer& tok = toks.first();
  // uint16 shards (llm.c's version 1) where the vocabulary fits, uint32 (version 2) beyond.
  const int32_t version = shard_version_for_vocab(tok.vocab_size());
  const auto S = int64_t(opt.shard_tokens);
  const uint64_t total_bytes = total_file_bytes(files);

  Stage stage(opt.out_dir);
  Spool spool(stage.dir(), S, version);
  PieceEncoder encoder(toks, spool);
  Progress progress(opt.progress, total_bytes);
  uint64_t bytes_done = 0;
  for (const auto& f : files)
    read_in_pieces(f, opt, toks, bytes_done, [&](std::string text, bool opens_doc) {
      encoder.add(std::move(text), opens_doc);
      progress.update(bytes_done, spool.total());
    });
  encoder.finish();
  spool.finish();
  progress.update(bytes_done, spool.total(), true);
  const std::vector<int64_t>& doc_starts = encoder.doc_starts();

  const int64_t total = spool.total();
  TRELLIS_REQUIRE(total > 0, "prepare: empty corpus: the {} input file(s) hold no text",
                  files.size());
  TRELLIS_REQUIRE(total >= 2,
                  "prepare: corpus too small: {} token; need at least 2 (one for training, one "
                  "for validation)",
                  total);
  auto n_val = static_cast<int64_t>(std::llround(double(total) * opt.val_fraction));
  n_val = std::clamp<int64_t>(n_val, 1, total - 1);
  const int64_t n_train = total - n_val;

  std::vector<std::string> written = write_split(stage, spool, doc_starts, n_train, S, version);
  if (toks.sentencepiece) {
    write_file_atomic(stage.path(kSentencePieceFile), toks.sp_model);
    written.push_back(kSentencePieceFile);
  }

  nlohmann::json meta;
  meta["tokenizer"] = tok.kind();
  // Relative to the data directory when the tokenizer lies in or beside it, else absolute: usable
  // from any working directory, and after moving the two together. (SentencePiece's model is in
  // the directory itself: none.)
  meta["tokenizer_dir"] =
      toks.sentencepiece ? std::string() : recorded_tokenizer_dir(opt.tokenizer_dir, opt.out_dir);
  meta["vocab_size"] = tok.vocab_size();
  meta["train_tokens"] = n_train;
  meta["val_tokens"] = n_val;
  meta["documents"] = doc_starts.size();

  // Into place: the shards and indexes, then meta.json.
  stage.publish(written);
  write_file_atomic((fs::path(opt.out_dir) / "meta.json").string(), meta.dump(2) + "\n");
  remove_stale_outputs(opt.out_dir, written);
  return PrepareResult{size_t(n_train), size_t(n_val), doc_starts.size(), tok.vocab_size()};
}

}  // namespace trellis
