#include "trellis/io/sharded_checkpoint.h"

#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "trellis/core/atomic_file.h"
#include "trellis/core/error.h"
#include "trellis/core/mapped_file.h"
#include "trellis/data/sentencepiece.h"
#include "trellis/io/checkpoint.h"
#include "trellis/io/safetensors.h"

namespace fs = std::filesystem;

namespace trellis {

namespace {

using json = nlohmann::json;

constexpr const char* kIndex = "index.json";
constexpr const char* kFormat = "trellis-sharded";
constexpr int kVersion = 1;

std::string shard_name(int rank) { return fmt::format("shard_{:05d}.safetensors", rank); }
std::string pieces_name(int rank) { return fmt::format("shard_{:05d}.json", rank); }

// Test hooks: TRELLIS_TEST_SAVE_SLEEP=SECONDS sleeps inside every rank's write, after its tensor
// file and before its piece list (kill-during-save tests); TRELLIS_TEST_SAVE_FAIL=RANK makes that
// rank's write fail (a full disk, a lost mount).
void test_save_sleep() {
  if (const char* s = std::getenv("TRELLIS_TEST_SAVE_SLEEP"))
    std::this_thread::sleep_for(std::chrono::duration<double>(std::atof(s)));
}
void test_save_fail(int rank, const std::string& path) {
  const char* s = std::getenv("TRELLIS_TEST_SAVE_FAIL");
  TRELLIS_REQUIRE(!s || std::atoi(s) != rank,
                  "{}: cannot write: simulated failure "
                  "(TRELLIS_TEST_SAVE_FAIL)",
                  path);
}

template <class T>
T get(const json& j, const char* key, const std::string& where) {
  TRELLIS_REQUIRE(j.is_object() && j.contains(key), "{}: missing key '{}'", where, key);
  try {
    return j.at(key).get<T>();
  } catch (const json::exception&) {
    TRELLIS_REQUIRE(false, "{}: key '{}' has the wrong type", where, key);
  }
  return T{};
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace

size_t write_rank_shard(const std::string& dir, int rank, const ParamLayout& layout,
                        const OwnedArrays& owned) {
  // The pieces: each owned range cut at tensor boundaries, without what another rank writes.
  struct Cut {
    const ParamSpec* spec;
    size_t lo, hi;  // within the tensor's slice
    size_t src;     // offset into the compact arrays
  };
  std::vector<Cut> cuts;
  size_t compact = 0, elements = 0;
  for (const FlatRange& r : owned.ranges) {
    TRELLIS_CHECK(r.begin <= r.end && r.end <= layout.size(), "owned range [{}, {}) of {}", r.begin,
                  r.end, layout.size());
    for (const ParamSpec& s : layout.specs()) {
      if (s.tied_copy || (s.split_dim < 0 && layout.tp_rank() != 0)) continue;
      const size_t lo = std::max(r.begin, s.offset), hi = std::min(r.end, s.offset + s.numel());
      if (lo >= hi) continue;
      cuts.push_back({&s, lo - s.offset, hi - s.offset, compact + (lo - r.begin)});
      elements += hi - lo;
    }
    compact += r.size();
  }
  const std::string file = shard_name(rank);
  const std::string path = (fs::path(dir) / file).string();
  json header = json::object();
  size_t offset = 0;
  for (const auto& [state, data] : owned.arrays) {
    header[state] = {
        {"dtype", "F32"}, {"shape", {elements}}, {"data_offsets", {offset, offset + elements * 4}}};
    offset += elements * 4;
  }
  header["__metadata__"] = {{"format", "pt"}, {"trellis", kFormat}};
  std::string head = header.dump();
  head.append((8 - head.size() % 8) % 8, ' ');  // floats stay 4-byte aligned when mapped
  test_save_fail(rank, path);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  TRELLIS_REQUIRE(f != nullptr, "{}: cannot write: {}", path, std::strerror(errno));
  bool ok = true;
  auto put = [&](const void* p, size_t n) { ok = ok && (n == 0 || std::fwrite(p, 1, n, f) == n); };
  uint64_t head_len = head.size();
  put(&head_len, 8);  // little-endian, as the format (and trellis) requires
  put(head.data(), head.size());
  for (const auto& [state, data] : owned.arrays)
    for (const Cut& c : cuts) put(data + c.src, (c.hi - c.lo) * sizeof(float));
  ok = ok && std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
  const int err = errno;
  ok = (std::fclose(f) == 0) && ok;
  TRELLIS_REQUIRE(ok, "{}: cannot write: {}", path, std::strerror(err ? err : EIO));
  const size_t bytes = 8 + head.size() + offset;
  test_save_sleep();

  json pieces = json::array(), tensors = json::object();
  size_t at = 0;
  for (const Cut& c : cuts) {
    const ParamSpec& s = *c.spec;
    pieces.push_back({{"tensor", s.name}, {"at", at}, {"begin", c.lo}, {"end", c.hi}});
    at += c.hi - c.lo;
    if (!tensors.contains(s.name))
      tensors[s.name] = {{"shape", s.global_shape},
                         {"dtype", "F32"},
                         {"split_dim", s.split_dim},
                         {"parts", s.parts},
                         {"export_rows", s.export_rows}};
  }
  json mine = {{"rank", rank},
               {"file", file},
               {"bytes", bytes},
               {"elements", elements},
               {"states", json::array()},
               {"tp", layout.tp()},
               {"tp_rank", layout.tp_rank()},
               {"layers", layout.stage().layers},
               {"tensors", tensors},
               {"pieces", pieces}};
  for (const auto& [state, data] : owned.arrays) mine["states"].push_back(state);
  write_file_atomic((fs::path(dir) / pieces_name(rank)).string(), mine.dump());
  return bytes;
}

void write_checkpoint_index(const std::string& dir, int world, const json& extra) {
  json index = extra;
  index["format"] = kFormat;
  index["version"] = kVersion;
  json files = json::object(), tensors = json::object(), states;
  for (int r = 0; r < world; ++r) {
    const std::string path = (fs::path(dir) / pieces_name(r)).string();
    const json mine = read_json_file(path);
    TRELLIS_CHECK(states.is_null() || states == mine.at("states"),
                  "{}: rank {} saved the states {}, rank 0 {}", dir, r, mine.at("states").dump(),
                  states.dump());
    states = mine.at("states");
    const std::string file = mine.at("file");
    files[file] = {
        {"rank", r},           {"bytes", mine.at("bytes")},     {"elements", mine.at("elements")},
        {"tp", mine.at("tp")}, {"tp_rank", mine.at("tp_rank")}, {"layers", mine.at("layers")}};
    for (const auto& [name, t] : mine.at("tensors").items()) {
      if (!tensors.contains(name)) {
        tensors[name] = t;
        tensors[name]["pieces"] = json::array();
      }
      TRELLIS_CHECK(tensors[name]["shape"] == t["shape"], "{}: ranks disagree on the shape of {}",
                    dir, name);
    }
    for (const json& p : mine.at("pieces")) {
      json piece = {{"file", file},       {"at", p.at("at")},    {"begin", p.at("begin")},
                    {"end", p.at("end")}, {"tp", mine.at("tp")}, {"tp_rank", mine.at("tp_rank")}};
      tensors[p.at("tensor").get<std::string>()]["pieces"].push_back(piece);
    }
  }
  index["states"] = states;
  index["files"] = files;
  index["tensors"] = tensors;
  write_file_atomic((fs::path(dir) / kIndex).string(), index.dump(1));
  for (int r = 0; r < world; ++r) fs::remove(fs::path(dir) / pieces_name(r));
  // The checks a reader makes (every element held exactly once): an incomplete save fails here,
  // while the directory still has its temporary name.
  CheckpointReader check(dir);
}

bool is_sharded_checkpoint(const std::string& dir) { return fs::exists(fs::path(dir) / kIndex); }

std::string checkpoint_incomplete(const std::string& dir) {
  const fs::path d(dir);
  if (!fs::exists(d / kIndex)) {
    // A whole-file checkpoint (written before sharding) has no index.
    if (fs::exists(d / "model.safetensors") && fs::exists(d / "state.json")) return {};
    return fmt::format("{}: missing (an incomplete checkpoint)", (d / kIndex).string());
  }
  json index;
  try {
    index = json::parse(read_file((d / kIndex).string()));
    for (const char* f : {"state.json", "config.json"})
      if (!fs::exists(d / f)) return fmt::format("{}: missing", (d / f).string());
    for (const auto& [file, info] : index.at("files").items()) {
      const fs::path p = d / file;
      std::error_code ec;
      const uintmax_t size = fs::file_size(p, ec);
      if (ec) return fmt::format("{}: missing", p.string());
      const uintmax_t want = info.at("bytes").get<uintmax_t>();
      if (size != want)
        return fmt::format("{}: {} bytes, the index says {} (a torn write)", p.string(), size,
                           want);
    }
  } catch (const std::exception& e) {
    return fmt::format("{}: unreadable: {}", (d / kIndex).string(), e.what());
  }
  return {};
}

// ---- reading ----

struct CheckpointReader::File {
  std::string path;
  size_t expect_bytes = 0;
  int64_t elements = 0;
  int rank = 0;  // the saving rank that wrote it (-1: not recorded)
  MappedFile map;
  bool mapped = false;
  std::map<std::string, const float*> states;  // after the header is checked
  // Whole-file checkpoints: the global buffers, read once.
  std::map<std::string, std::vector<float>> memory;
};

CheckpointReader::CheckpointReader(const std::string& dir) : dir_(dir) {
  TRELLIS_REQUIRE(fs::is_directory(dir), "{}: checkpoint directory not found", dir);
  sharded_ = is_sharded_checkpoint(dir);
  if (sharded_)
    open_sharded();
  else
    open_whole();
}

CheckpointReader::~CheckpointReader() = default;

bool CheckpointReader::has_state(const std::string& state) const {
  return std::find(states_.begin(), states_.end(), state) != states_.end();
}

std::vector<std::string> CheckpointReader::tensor_names() const {
  std::vector<std::string> out;
  for (const auto& [name, t] : tensors_) out.push_back(name);
  return out;
}

int64_t CheckpointReader::saved_elements() const {
  int64_t n = 0;
  for (const auto& [name, t] : tensors_) n += numel_of(t.shape);
  return n;
}

size_t CheckpointReader::bytes_touched() const {
  size_t n = 0;
  for (const auto& f : files_) n += f->mapped ? f->map.size() : 0;
  return n;
}

CheckpointReader::Storage CheckpointReader::storage(const std::string& name) const {
  const Tensor& t = tensors_.at(name);
  Storage s{t.shape, t.tp, {}};
  // A piece is named by the saving rank that wrote it, so a whole-file checkpoint (the whole model
  // in one place) is stored as a one-rank sharded one is.
  for (const Piece& p : t.pieces) {
    const File& f = *files_[size_t(p.file)];
    const std::string by =
        f.rank >= 0 ? fmt::format("rank {}", f.rank) : fs::path(f.path).filename().string();
    s.pieces.push_back(fmt::format("{} tp rank {} [{}, {})", by, p.tp_rank, p.begin, p.end));
  }
  return s;
}

void CheckpointReader::open_sharded() {
  const std::string path = (fs::path(dir_) / kIndex).string();
  const json index = read_json_file(path);
  TRELLIS_REQUIRE(index.is_object() && index.value("format", "") == kFormat,
                  "{}: not a trellis sharded checkpoint index", path);
  const int version = get<int>(index, "version", path);
  TRELLIS_REQUIRE(version == kVersion, "{}: index version {} (this trellis reads {})", path,
                  version, kVersion);
  states_ = get<std::vector<std::string>>(index, "states", path);
  TRELLIS_REQUIRE(!states_.empty() && states_[0] == "params", "{}: 'states' must start with params",
                  path);
  const std::map<std::string, int> file_index = open_index_files(index, path);
  const json& tensors = index.contains("tensors") ? index["tensors"] : json();
  TRELLIS_REQUIRE(tensors.is_object(), "{}: missing object 'tensors'", path);
  for (const auto& [name, t] : tensors.items())
    tensors_[name] = index_tensor(t, file_index, path + " tensors." + name);
}

std::map<std::string, int> CheckpointReader::open_index_files(const json& index,
                                                              const std::string& path) {
  std::map<std::string, int> file_index;
  const json& files = index.contains("files") ? index["files"] : json();
  TRELLIS_REQUIRE(files.is_object(), "{}: missing object 'files'", path);
  for (const auto& [name, info] : files.items()) {
    // Files next to the index, never elsewhere on the machine.
    const fs::path rel(name);
    TRELLIS_REQUIRE(
        !name.empty() && rel.is_relative() && rel.filename() == rel && name != "." && name != "..",
        "{}: file '{}' is not a file name in {}", path, name, dir_);
    auto f = std::make_unique<File>();
    f->path = (fs::path(dir_) / rel).string();
    f->expect_bytes = get<size_t>(info, "bytes", path + " files." + name);
    f->elements = get<int64_t>(info, "elements", path + " files." + name);
    // Used for comparing layouts only: an index without it names its files instead.
    f->rank = info.contains("rank") ? get<int>(info, "rank", path + " files." + name) : -1;
    TRELLIS_REQUIRE(f->elements >= 0, "{}: files.{}.elements is negative", path, name);
    file_index[name] = int(files_.size());
    files_.push_back(std::move(f));
  }
  return file_index;
}

CheckpointReader::Tensor CheckpointReader::index_tensor(
    const json& t, const std::map<std::string, int>& file_index, const std::string& where) const {
  Tensor tensor;
  tensor.shape = get<std::vector<int64_t>>(t, "shape", where);
  TRELLIS_REQUIRE(!tensor.shape.empty() && tensor.shape.size() <= 8, "{}: bad shape", where);
  for (int64_t d : tensor.shape)
    TRELLIS_REQUIRE(d >= 1 && d <= (int64_t(1) << 40), "{}: bad shape", where);
  TRELLIS_REQUIRE(get<std::string>(t, "dtype", where) == "F32", "{}: dtype must be F32", where);
  tensor.split_dim = get<int>(t, "split_dim", where);
  tensor.parts = get<int>(t, "parts", where);
  TRELLIS_REQUIRE(
      tensor.split_dim >= -1 && tensor.split_dim < int(tensor.shape.size()) && tensor.parts >= 1,
      "{}: bad split_dim/parts", where);
  const json& pieces = t.contains("pieces") ? t["pieces"] : json();
  TRELLIS_REQUIRE(pieces.is_array() && !pieces.empty(), "{}: no pieces", where);
  tensor.tp = 0;
  for (const json& p : pieces) {
    Piece piece;
    const std::string file = get<std::string>(p, "file", where);
    const auto known = file_index.find(file);
    TRELLIS_REQUIRE(known != file_index.end(), "{}: piece in '{}', which 'files' does not list",
                    where, file);
    piece.file = known->second;
    piece.at = get<int64_t>(p, "at", where);
    piece.begin = get<int64_t>(p, "begin", where);
    piece.end = get<int64_t>(p, "end", where);
    const int tp = tensor.split_dim < 0 ? 1 : get<int>(p, "tp", where);
    piece.tp_rank = tensor.split_dim < 0 ? 0 : get<int>(p, "tp_rank", where);
    TRELLIS_REQUIRE(tensor.tp == 0 || tensor.tp == tp, "{}: pieces of different tp", where);
    tensor.tp = tp;
    TRELLIS_REQUIRE(tp >= 1 && piece.tp_rank >= 0 && piece.tp_rank < tp, "{}: bad tp_rank",
                    where);
    const int64_t n = piece.end - piece.begin;
    TRELLIS_REQUIRE(piece.begin >= 0 && n > 0 && piece.at >= 0 &&
                        piece.at + n <= files_[size_t(piece.file)]->elements,
                    "{}: piece [{}, {}) at {} lies outside {}", where, piece.begin, piece.end,
                    piece.at, file);
    tensor.pieces.push_back(piece);
  }
  require_pieces_tile(tensor, where);
  return tensor;
}

// The slices: split_dim divided by tp (parts split separately), then every slice tiled by its
// pieces exactly once. Sorts the pieces by (tp_rank, begin).
void CheckpointReader::require_pieces_tile(Tensor& tensor, const std::string& where) {
  int64_t slice = numel_of(tensor.shape);
  if (tensor.split_dim >= 0) {
    const int64_t D = tensor.shape[size_t(tensor.split_dim)];
    TRELLIS_REQUIRE(D % (int64_t(tensor.tp) * tensor.parts) == 0,
                    "{}: dimension {} does not split into {} parts over tp={}", where, D,
                    tensor.parts, tensor.tp);
    slice /= tensor.tp;
  }
  std::sort(tensor.pieces.begin(), tensor.pieces.end(), [](const Piece& a, const Piece& b) {
    return a.tp_rank != b.tp_rank ? a.tp_rank < b.tp_rank : a.begin < b.begin;
  });
  size_t i = 0;
  for (int r = 0; r < tensor.tp; ++r) {
    int64_t covered = 0;
    for (; i < tensor.pieces.size() && tensor.pieces[i].tp_rank == r; ++i) {
      TRELLIS_REQUIRE(tensor.pieces[i].begin == covered,
                      "{}: elements [{}, {}) of tp rank {}'s slice are {}", where, covered,
                      tensor.pieces[i].begin, r,
                      tensor.pieces[i].begin < covered ? "held twice" : "held by no piece");
      covered = tensor.pieces[i].end;
    }
    TRELLIS_REQUIRE(covered == slice, "{}: tp rank {}'s slice has {} elements, pieces hold {}",
                    where, r, slice, covered);
  }
}

void CheckpointReader::open_whole() {
  CheckpointData ck = load_checkpoint(dir_, true);
  const ParamLayout global(ck.model);
  auto f = std::make_unique<File>();
  f->path = dir_;
  f->memory["params"] = std::move(ck.params);
  states_.push_back("params");
  for (auto& [name, buf] : ck.optimizer.buffers) {
    f->memory[name] = std::move(buf);
    states_.push_back(name);
  }
  for (const ParamSpec& s : global.specs()) {
    if (s.tied_copy) continue;
    Tensor t;
    t.shape = s.global_shape;
    t.split_dim = s.split_dim;
    t.parts = s.parts;
    t.tp = 1;
    t.pieces.push_back({0, 0, int64_t(s.numel()), 0, int64_t(s.offset)});
    tensors_[s.name] = t;
  }
  files_.push_back(std::move(f));
}

const float* CheckpointReader::state_data(int file, const std::string& state) {
  File& f = *files_[size_t(file)];
  if (!f.memory.empty()) {
    auto it = f.memory.find(state);
    TRELLIS_REQUIRE(it != f.memory.end(), "{}: no '{}' state", dir_, state);
    return it->second.data();
  }
  if (!f.mapped) {
    f.map = MappedFile(f.path);
    f.mapped = true;
    TRELLIS_REQUIRE(f.map.size() == f.expect_bytes,
                    "{}: {} bytes, the index says {} (a torn or replaced file)", f.path,
                    f.map.size(), f.expect_bytes);
    TRELLIS_REQUIRE(f.map.size() >= 8, "{}: not a safetensors file", f.path);
    uint64_t head_len = 0;
    std::memcpy(&head_len, f.map.data(), 8);
    TRELLIS_REQUIRE(head_len <= f.map.size() - 8, "{}: header length {} runs past the file", f.path,
                    head_len);
    json header;
    try {
      header = json::parse(f.map.data() + 8, f.map.data() + 8 + head_len);
    } catch (const json::exception& e) {
      TRELLIS_REQUIRE(false, "{}: safetensors header is not valid JSON: {}", f.path, e.what());
    }
    const size_t data_size = f.map.size() - 8 - head_len;
    for (const std::string& s : states_) {
      const std::string where = f.path + " tensor " + s;
      TRELLIS_REQUIRE(header.contains(s), "{}: no tensor '{}'", f.path, s);
      const json& e = header[s];
      TRELLIS_REQUIRE(get<std::string>(e, "dtype", where) == "F32", "{}: not F32", where);
      const auto shape = get<std::vector<int64_t>>(e, "shape", where);
      const auto off = get<std::vector<uint64_t>>(e, "data_offsets", where);
      TRELLIS_REQUIRE(
          shape.size() == 1 && shape[0] == f.elements && off.size() == 2 && off[0] <= off[1] &&
              off[1] <= data_size && off[1] - off[0] == uint64_t(f.elements) * 4 &&
              off[0] % 4 == 0 && head_len % 4 == 0,
          "{}: shape or data_offsets do not match the index's {} elements", where, f.elements);
      f.states[s] = reinterpret_cast<const float*>(f.map.data() + 8 + head_len + off[0]);
    }
  }
  auto it = f.states.find(state);
  TRELLIS_REQUIRE(it != f.states.end(), "{}: no '{}' state", f.path, state);
  return it->second;
}

// Elements [lo, hi) of this layout's slice (tp_rank) of `spec`, from the pieces that hold them.
// A run of elements stays contiguous in both slices until it reaches the end of a row segment
// of the split dimension in either layout's slice (a part of a fused tensor, a tp boundary).
void CheckpointReader::read_tensor(const ParamSpec& spec, int tp_rank, int64_t lo, int64_t hi,
                                   const std::string& state, float* out) {
  auto it = tensors_.find(spec.name);
  TRELLIS_REQUIRE(it != tensors_.end(), "{}: the checkpoint has no tensor '{}'", dir_, spec.name);
  const Tensor& t = it->second;
  const std::vector<int64_t>& g = spec.global_shape;
  // The same tensor: equal shapes, except that vocabulary padding (rows of a split dimension 0)
  // depends on tp.
  bool same = t.shape.size() == g.size() && t.split_dim == spec.split_dim && t.parts == spec.parts;
  for (size_t d = 0; same && d < g.size(); ++d)
    same = t.shape[d] == g[d] || (d == 0 && spec.split_dim == 0 && spec.parts == 1 &&
                                  spec.export_rows >= 0 && t.shape[d] >= spec.export_rows);
  TRELLIS_REQUIRE(same,
                  "{}: tensor '{}' has shape [{}] (split dim {}, {} parts), expected [{}] ({}, {})",
                  dir_, spec.name, fmt::join(t.shape, ", "), t.split_dim, t.parts,
                  fmt::join(g, ", "), spec.split_dim, spec.parts);
  if (spec.split_dim < 0) {
    // Replicated: the element index is the global one on both sides.
    for (const Piece& p : t.pieces) {
      const int64_t a = std::max(lo, p.begin), b = std::min(hi, p.end);
      if (a >= b) continue;
      const float* src = state_data(p.file, state) + p.at + (a - p.begin);
      std::memcpy(out + (a - lo), src, size_t(b - a) * sizeof(float));
    }
    return;
  }
  const size_t sd = size_t(spec.split_dim);
  int64_t inner = 1;
  for (size_t d = sd + 1; d < g.size(); ++d) inner *= g[d];
  const int64_t D = spec.shape[sd], parts = spec.parts;
  const int64_t pl = D / parts, pg = g[sd] / parts;                           // this layout
  const int64_t Dg_s = t.shape[sd], pg_s = Dg_s / parts, pl_s = pg_s / t.tp;  // the saved one
  const int64_t D_s = Dg_s / t.tp;
  int64_t i = lo;
  size_t piece = 0;
  while (i < hi) {
    const int64_t o = i / (D * inner), d = i / inner % D, in = i % inner;
    const int64_t gd = d / pl * pg + int64_t(tp_rank) * pl + d % pl;
    int64_t run_d = pl - d % pl;  // rows of the split dimension left in this part here
    if (gd >= Dg_s) {
      // Vocabulary padding beyond the saved padding: zero (never trained).
      const int64_t n = std::min(hi - i, (run_d - 1) * inner + (inner - in));
      std::fill_n(out + (i - lo), n, 0.0f);
      i += n;
      continue;
    }
    const int64_t part_s = gd / pg_s, w = gd % pg_s, r_s = w / pl_s;
    const int64_t ds = part_s * pl_s + w % pl_s;
    run_d = std::min({run_d, pl_s - w % pl_s, Dg_s - gd});
    const int64_t li = (o * D_s + ds) * inner + in;
    // The piece of tp rank r_s holding li (pieces sorted; usually the next one).
    if (piece >= t.pieces.size() || t.pieces[piece].tp_rank != r_s || li < t.pieces[piece].begin ||
        li >= t.pieces[piece].end) {
      auto p =
          std::lower_bound(t.pieces.begin(), t.pieces.end(), std::make_pair(r_s, li),
                           [](const Piece& a, const std::pair<int64_t, int64_t>& k) {
                             return a.tp_rank != k.first ? a.tp_rank < k.first : a.end <= k.second;
                           });
      TRELLIS_CHECK(p != t.pieces.end() && p->tp_rank == r_s && p->begin <= li && li < p->end,
                    "{}: no piece holds element {} of tp rank {} of '{}'", dir_, li, r_s,
                    spec.name);
      piece = size_t(p - t.pieces.begin());
    }
    const Piece& p = t.pieces[piece];
    const int64_t n = std::min({hi - i, (run_d - 1) * inner + (inner - in), p.end - li});
    const float* src = state_data(p.file, state) + p.at + (li - p.begin);
    std::memcpy(out + (i - lo), src, size_t(n) * sizeof(float));
    i += n;
  }
}

void CheckpointReader::read(const ParamLayout& layout, const std::vector<FlatRange>& ranges,
                            const std::string& state, float* compact) {
  TRELLIS_REQUIRE(has_state(state), "{}: the checkpoint has no '{}' state (optimizer changed?)",
                  dir_, state);
  size_t pos = 0;
  for (const FlatRange& r : ranges) {
    TRELLIS_CHECK(r.begin <= r.end && r.end <= layout.size(), "read range [{}, {}) of {}", r.begin,
                  r.end, layout.size());
    std::fill_n(compact + pos, r.size(), 0.0f);  // alignment gaps
    for (const ParamSpec& s : layout.specs()) {
      const size_t lo = std::max(r.begin, s.offset), hi = std::min(r.end, s.offset + s.numel());
      if (lo >= hi) continue;
      read_tensor(s, layout.tp_rank(), int64_t(lo - s.offset), int64_t(hi - s.offset), state,
                  compact + pos + (lo - r.begin));
    }
    pos += r.size();
  }
  // What was read stays in the page cache, not in this process's resident set.
  for (const auto& f : files_)
    if (f->mapped) f->map.release_pages();
}

std::vector<std::string> export_checkpoint(const std::string& dir, const std::string& out,
                                           size_t max_shard_bytes) {
  const std::string cfg_path = (fs::path(dir) / "config.json").string();
  const ModelConfig model = read_model_config(cfg_path);
  const std::string config_text = read_file(cfg_path);
  const ParamLayout global(model);
  CheckpointReader reader(dir);
  // Tensors in layout order, rows the family exports (the true vocabulary), cut into files of at
  // most max_shard_bytes (a larger tensor gets a file of its own).
  struct Item {
    const ParamSpec* spec;
    std::vector<int64_t> shape;
    size_t count;
  };
  std::vector<std::vector<Item>> shards(1);
  size_t in_shard = 0, total = 0;
  for (const ParamSpec& s : global.specs()) {
    if (s.tied_copy) continue;
    Item it{&s, s.shape, 0};
    if (s.export_rows >= 0) it.shape[0] = s.export_rows;
    it.count = size_t(numel_of(it.shape));
    const size_t bytes = it.count * 4;
    if (in_shard > 0 && in_shard + bytes > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(it);
    in_shard += bytes;
    total += bytes;
  }
  fs::create_directories(out);
  const bool single = shards.size() == 1;
  // A directory holds one form or the other: remove what an earlier export of the other form
  // left (a reader would take model.safetensors over the index).
  for (const auto& e : fs::directory_iterator(out)) {
    const std::string name = e.path().filename().string();
    const bool ours = name == "model.safetensors" || name == "model.safetensors.index.json" ||
                      (name.rfind("model-", 0) == 0 && name.size() > 12 &&
                       name.substr(name.size() - 12) == ".safetensors");
    if (ours) fs::remove(e.path());
  }
  std::vector<std::string> written;
  json weight_map = json::object();
  for (size_t k = 0; k < shards.size(); ++k) {
    const std::string file =
        single ? "model.safetensors"
               : fmt::format("model-{:05d}-of-{:05d}.safetensors", k + 1, shards.size());
    std::vector<std::vector<float>> data;
    std::vector<TensorRef> refs;
    data.reserve(shards[k].size());
    for (const Item& it : shards[k]) {
      const ParamSpec& s = *it.spec;
      data.emplace_back(it.count);
      // The exported rows are the tensor's first ones.
      reader.read(global, {{s.offset, s.offset + it.count}}, "params", data.back().data());
      refs.push_back({s.name, it.shape, data.back().data()});
      weight_map[s.name] = file;
    }
    write_safetensors((fs::path(out) / file).string(), refs, {{"format", "pt"}});
    written.push_back((fs::path(out) / file).string());
  }
  if (!single) {
    const json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    write_file_atomic((fs::path(out) / "model.safetensors.index.json").string(), index.dump(2));
    written.push_back((fs::path(out) / "model.safetensors.index.json").string());
  }
  write_file_atomic((fs::path(out) / "config.json").string(), config_text);
  written.push_back((fs::path(out) / "config.json").string());
  // A SentencePiece model's tokenizer travels with it, as in Hugging Face directories (an
  // earlier export's that this checkpoint does not have would disagree with it).
  const fs::path tokenizer = fs::path(dir) / kSentencePieceFile;
  if (fs::exists(tokenizer)) {
    write_file_atomic((fs::path(out) / kSentencePieceFile).string(), read_file(tokenizer.string()));
    written.push_back((fs::path(out) / kSentencePieceFile).string());
  } else {
    fs::remove(fs::path(out) / kSentencePieceFile);
  }
  return written;
}

}  // namespace trellis
