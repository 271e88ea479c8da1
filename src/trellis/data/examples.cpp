#include "trellis/data/examples.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "trellis/core/atomic_file.h"
#include "trellis/core/error.h"
#include "trellis/data/tokenizer_dir.h"

namespace trellis {

static_assert(std::endian::native == std::endian::little, "examples I/O assumes little-endian");

namespace fs = std::filesystem;

namespace {
constexpr char kMagic[8] = {'T', 'R', 'L', 'S', 'E', 'X', 'M', 'P'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 8 + 4 + 4 + 8;

template <class T>
void put(std::string& out, const T& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}
}  // namespace

std::span<const uint32_t> ExampleSet::source(size_t i) const {
  const uint64_t begin = i == 0 ? 0 : ends[2 * i - 1];
  return {values.data() + begin, size_t(ends[2 * i] - begin)};
}

std::span<const uint32_t> ExampleSet::target(size_t i) const {
  return {values.data() + ends[2 * i], size_t(ends[2 * i + 1] - ends[2 * i])};
}

void ExampleSet::add(int32_t label, std::span<const uint32_t> src, std::span<const uint32_t> tgt) {
  labels.push_back(label);
  values.insert(values.end(), src.begin(), src.end());
  ends.push_back(values.size());
  values.insert(values.end(), tgt.begin(), tgt.end());
  ends.push_back(values.size());
}

void write_examples(const std::string& path, const ExampleSet& set) {
  TRELLIS_CHECK(set.ends.size() == 2 * set.size(), "{}: malformed example set", path);
  const uint32_t top =
      set.values.empty() ? 0 : *std::max_element(set.values.begin(), set.values.end());
  const uint32_t width = top < 256 ? 1 : top < 65536 ? 2 : 4;
  std::string out;
  out.reserve(kHeaderBytes + set.size() * 20 + set.values.size() * width);
  out.append(kMagic, 8);
  put(out, kVersion);
  put(out, width);
  put(out, uint64_t(set.size()));
  out.append(reinterpret_cast<const char*>(set.labels.data()), set.labels.size() * 4);
  out.append(reinterpret_cast<const char*>(set.ends.data()), set.ends.size() * 8);
  for (uint32_t v : set.values) out.append(reinterpret_cast<const char*>(&v), width);
  write_file_atomic(path, out);
}

ExampleSet read_examples(const std::string& path) {
  const std::string bytes = read_file(path);
  TRELLIS_REQUIRE(bytes.size() >= kHeaderBytes && std::memcmp(bytes.data(), kMagic, 8) == 0,
                  "{}: not an examples file (bad magic)", path);
  uint32_t version = 0, width = 0;
  uint64_t n = 0;
  std::memcpy(&version, bytes.data() + 8, 4);
  std::memcpy(&width, bytes.data() + 12, 4);
  std::memcpy(&n, bytes.data() + 16, 8);
  TRELLIS_REQUIRE(version == kVersion, "{}: unsupported examples version {} (expected {})", path,
                  version, kVersion);
  TRELLIS_REQUIRE(width == 1 || width == 2 || width == 4, "{}: value width {} is not 1, 2 or 4",
                  path, width);
  const uint64_t room = bytes.size() - kHeaderBytes;
  TRELLIS_REQUIRE(n <= room / 20, "{}: truncated: header says {} examples", path, n);
  ExampleSet set;
  set.labels.resize(n);
  set.ends.resize(2 * n);
  const char* p = bytes.data() + kHeaderBytes;
  std::memcpy(set.labels.data(), p, n * 4);
  std::memcpy(set.ends.data(), p + n * 4, n * 16);
  p += n * 20;
  uint64_t prev = 0;
  for (uint64_t e : set.ends) {
    TRELLIS_REQUIRE(e >= prev, "{}: corrupt: example ends are not increasing", path);
    prev = e;
  }
  const uint64_t count = n ? set.ends.back() : 0;
  // Divide rather than multiply: a corrupt count * width could wrap around to the right size.
  const uint64_t value_bytes = room - n * 20;
  TRELLIS_REQUIRE(value_bytes % width == 0 && value_bytes / width == count,
                  "{}: the index says {} values of {} bytes, the file holds {} bytes for them",
                  path, count, width, value_bytes);
  set.values.resize(count);
  for (uint64_t i = 0; i < count; ++i) {
    uint32_t v = 0;
    std::memcpy(&v, p + i * width, width);
    set.values[i] = v;
  }
  return set;
}

bool is_task_dir(const std::string& dir) {
  const fs::path meta = fs::path(dir) / "meta.json";
  if (!fs::exists(meta)) return false;
  const auto j = nlohmann::json::parse(read_file(meta.string()), nullptr, false);
  return j.is_object() && j.contains("task");
}

TaskMeta read_task_meta(const std::string& dir) {
  const std::string path = (fs::path(dir) / "meta.json").string();
  const auto j = nlohmann::json::parse(read_file(path), nullptr, false);
  TRELLIS_REQUIRE(j.is_object(), "{}: not valid JSON", path);
  TaskMeta m;
  try {
    m.task = j.at("task").get<std::string>();
    m.tokenizer = j.value("tokenizer", std::string("byte"));
    m.tokenizer_dir = j.value("tokenizer_dir", std::string());
    m.vocab_size = j.at("vocab_size").get<int>();
    m.special_token = j.at("special_token").get<int>();
    m.classes = j.value("classes", std::vector<std::string>{});
    m.feature_dim = j.value("feature_dim", 0);
    if (j.contains("image")) {
      const auto& im = j.at("image");
      m.image_height = im.at("height").get<int>();
      m.image_width = im.at("width").get<int>();
      m.patch_height = im.at("patch_height").get<int>();
      m.patch_width = im.at("patch_width").get<int>();
    }
    m.val_split = j.value("val_split", std::string("val"));
    m.train_examples = j.at("train_examples").get<int64_t>();
    m.val_examples = j.at("val_examples").get<int64_t>();
    m.max_source_len = j.at("max_source_len").get<int64_t>();
    m.max_target_len = j.value("max_target_len", int64_t(0));
  } catch (const nlohmann::json::exception& e) {
    TRELLIS_REQUIRE(false, "{}: {}", path, e.what());
  }
  // A SentencePiece model is the directory's own tokenizer.model.
  if (m.tokenizer == "sentencepiece")
    m.tokenizer_dir = fs::absolute(dir).lexically_normal().string();
  m.tokenizer_dir = resolved_tokenizer_dir(m.tokenizer_dir, dir);
  TRELLIS_REQUIRE(m.task == "classify" || m.task == "translate",
                  "{}: task '{}' is not classify or translate", path, m.task);
  TRELLIS_REQUIRE(m.task != "classify" || m.classes.size() >= 2,
                  "{}: a classification dataset needs at least 2 classes", path);
  TRELLIS_REQUIRE(m.vocab_size > 0 && m.special_token >= 0 && m.special_token < m.vocab_size,
                  "{}: special_token {} is outside vocab_size {}", path, m.special_token,
                  m.vocab_size);
  TRELLIS_REQUIRE(
      m.image_height == 0 ||
          (m.image_height > 0 && m.image_width > 0 && m.patch_height > 0 && m.patch_width > 0 &&
           m.image_height % m.patch_height == 0 && m.image_width % m.patch_width == 0 &&
           int64_t(m.patch_height) * m.patch_width == m.feature_dim),
      "{}: image {}x{} in patches of {}x{} does not match feature_dim {}", path, m.image_height,
      m.image_width, m.patch_height, m.patch_width, m.feature_dim);
  return m;
}

void write_task_meta(const std::string& dir, const TaskMeta& m) {
  nlohmann::json j = {{"task", m.task},
                      {"tokenizer", m.tokenizer},
                      {"tokenizer_dir", m.tokenizer_dir},
                      {"vocab_size", m.vocab_size},
                      {"special_token", m.special_token},
                      {"val_split", m.val_split},
                      {"train_examples", m.train_examples},
                      {"val_examples", m.val_examples},
                      {"max_source_len", m.max_source_len},
                      {"max_target_len", m.max_target_len}};
  if (!m.classes.empty()) j["classes"] = m.classes;
  if (m.feature_dim > 0) j["feature_dim"] = m.feature_dim;
  if (m.image_height > 0)
    j["image"] = {{"height", m.image_height},
                  {"width", m.image_width},
                  {"patch_height", m.patch_height},
                  {"patch_width", m.patch_width}};
  write_file_atomic((fs::path(dir) / "meta.json").string(), j.dump(2) + "\n");
}

}  // namespace trellis
