#include "trellis/io/safetensors.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "trellis/core/atomic_file.h"
#include "trellis/core/error.h"

namespace trellis {

namespace {

using json = nlohmann::json;

void put_u64_le(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t get_u64_le(const std::string& in) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(static_cast<unsigned char>(in[i])) << (8 * i);
  return v;
}

// Element count of a shape, or false on a negative dim or when its bytes (at most 8 per element)
// would overflow.
bool shape_count(const std::vector<int64_t>& shape, uint64_t& count) {
  count = 1;
  for (int64_t d : shape) {
    if (d < 0) return false;
    if (d != 0 && count > std::numeric_limits<uint64_t>::max() / 8 / uint64_t(d)) return false;
    count *= uint64_t(d);
  }
  return true;
}

// Bytes per element of a safetensors dtype; 0 for none. Every dtype of the format is accepted so
// that a file's other tensors (a bool attention mask, integer position ids) do not stop it from
// loading; only F32, F16 and BF16 can be read as floats.
int dtype_size(const std::string& dtype) {
  static const std::map<std::string, int> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"I64", 8}, {"U64", 8},     {"F64", 8}};
  auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

// The 8-byte header length and the JSON header after it; data_start: where the data section
// begins.
json parse_header(const std::string& bytes, const std::string& path, size_t& data_start) {
  TRELLIS_REQUIRE(bytes.size() >= 8, "{}: not a safetensors file: {} bytes, need at least 8", path,
                  bytes.size());
  const uint64_t header_len = get_u64_le(bytes);
  TRELLIS_REQUIRE(header_len <= bytes.size() - 8,
                  "{}: safetensors header length {} runs past the end of the file ({} bytes)", path,
                  header_len, bytes.size());
  data_start = 8 + header_len;
  json header;
  try {
    header = json::parse(bytes.begin() + 8, bytes.begin() + long(data_start));
  } catch (const json::exception& e) {
    TRELLIS_REQUIRE(false, "{}: safetensors header is not valid JSON: {}", path, e.what());
  }
  TRELLIS_REQUIRE(header.is_object(), "{}: safetensors header is not a JSON object", path);
  return header;
}

// "__metadata__": an object of strings.
void read_metadata(const json& v, const std::string& path,
                   std::map<std::string, std::string>& metadata) {
  TRELLIS_REQUIRE(v.is_object(), "{}: __metadata__ is not a JSON object", path);
  for (auto m = v.begin(); m != v.end(); ++m) {
    TRELLIS_REQUIRE(m.value().is_string(), "{}: __metadata__ value of '{}' is not a string", path,
                    m.key());
    metadata[m.key()] = m.value().get<std::string>();
  }
}

// One tensor's header entry, checked: a known dtype, a shape of non-negative integers whose
// bytes are exactly its data_offsets [begin, end) inside the data section.
struct TensorRecord {
  std::vector<int64_t> shape;
  std::string dtype;
  uint64_t begin = 0, end = 0, count = 0;
};

TensorRecord parse_tensor_record(const std::string& path, const std::string& key, const json& v,
                                 uint64_t data_size) {
  TRELLIS_REQUIRE(v.is_object(), "{}: tensor '{}': entry is not a JSON object", path, key);
  TRELLIS_REQUIRE(v.contains("dtype") && v["dtype"].is_string(),
                  "{}: tensor '{}': missing or non-string dtype", path, key);
  TensorRecord r;
  r.dtype = v["dtype"].get<std::string>();
  const int element_size = dtype_size(r.dtype);
  TRELLIS_REQUIRE(element_size > 0, "{}: tensor '{}': unsupported dtype '{}'", path, key, r.dtype);
  TRELLIS_REQUIRE(v.contains("shape") && v["shape"].is_array(),
                  "{}: tensor '{}': missing or non-array shape", path, key);
  for (const json& d : v["shape"]) {
    TRELLIS_REQUIRE(d.is_number_integer() && d.get<int64_t>() >= 0,
                    "{}: tensor '{}': shape {} has a non-integer or negative dimension", path, key,
                    v["shape"].dump());
    r.shape.push_back(d.get<int64_t>());
  }
  TRELLIS_REQUIRE(shape_count(r.shape, r.count), "{}: tensor '{}': shape {} is too large", path,
                  key, v["shape"].dump());
  const json& off = v.contains("data_offsets") ? v["data_offsets"] : json();
  TRELLIS_REQUIRE(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() &&
                      off[1].is_number_unsigned(),
                  "{}: tensor '{}': data_offsets must be [begin, end] of non-negative integers",
                  path, key);
  r.begin = off[0].get<uint64_t>();
  r.end = off[1].get<uint64_t>();
  TRELLIS_REQUIRE(r.begin <= r.end && r.end <= data_size,
                  "{}: tensor '{}': data_offsets [{}, {}) out of range (data section is {} "
                  "bytes)",
                  path, key, r.begin, r.end, data_size);
  TRELLIS_REQUIRE(r.end - r.begin == r.count * uint64_t(element_size),
                  "{}: tensor '{}': data_offsets [{}, {}) hold {} bytes but shape {} needs {}",
                  path, key, r.begin, r.end, r.end - r.begin, v["shape"].dump(),
                  r.count * uint64_t(element_size));
  return r;
}

struct Range {
  uint64_t begin, end;
  const std::string* name;
};

// The ranges must tile the data section exactly: overlap would alias two tensors, a gap means
// bytes nobody accounts for (a truncated or spliced file).
void require_ranges_tile(std::vector<Range> ranges, uint64_t data_size, const std::string& path) {
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;
  for (const Range& r : ranges) {
    TRELLIS_REQUIRE(r.begin >= covered || r.begin == r.end,
                    "{}: tensor '{}': data_offsets [{}, {}) overlap another tensor", path, *r.name,
                    r.begin, r.end);
    TRELLIS_REQUIRE(r.begin <= covered,
                    "{}: tensor '{}': bytes [{}, {}) of the data section "
                    "belong to no tensor",
                    path, *r.name, covered, r.begin);
    covered = std::max(covered, r.end);
  }
  TRELLIS_REQUIRE(covered == data_size,
                  "{}: bytes [{}, {}) of the data section belong to no tensor", path, covered,
                  data_size);
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<TensorRef>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  // Sorted by name so the same tensors always give the same bytes, whatever the caller's order.
  std::vector<const TensorRef*> order;
  order.reserve(tensors.size());
  for (const auto& t : tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(),
            [](const TensorRef* a, const TensorRef* b) { return a->name < b->name; });

  json header = json::object();
  uint64_t offset = 0;
  std::vector<uint64_t> counts;
  for (size_t i = 0; i < order.size(); ++i) {
    const TensorRef& t = *order[i];
    TRELLIS_CHECK(i == 0 || order[i - 1]->name != t.name, "{}: duplicate tensor name '{}'", path,
                  t.name);
    TRELLIS_CHECK(t.name != "__metadata__", "{}: tensor name '__metadata__' is reserved", path);
    uint64_t count = 0;
    TRELLIS_CHECK(shape_count(t.shape, count), "{}: tensor '{}' has an invalid shape", path,
                  t.name);
    TRELLIS_CHECK(count == 0 || t.data != nullptr, "{}: tensor '{}' has no data", path, t.name);
    counts.push_back(count);
    header[t.name] = {
        {"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + count * 4}}};
    offset += count * 4;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;

  std::string head = header.dump();
  // Padding to 8 bytes keeps the data section (and so every F32 tensor) aligned when mmapped.
  head.append((8 - head.size() % 8) % 8, ' ');

  std::string bytes;
  bytes.reserve(8 + head.size() + offset);
  put_u64_le(bytes, head.size());
  bytes += head;
  static_assert(sizeof(float) == 4);
  // Raw host floats: trellis only runs on little-endian machines, as the format requires.
  for (size_t i = 0; i < order.size(); ++i)
    if (counts[i] > 0) bytes.append(reinterpret_cast<const char*>(order[i]->data), counts[i] * 4);
  write_file_atomic(path, bytes);
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path), bytes_(read_file(path)) {
  parse();
}

SafetensorsFile::SafetensorsFile(std::string bytes, const std::string& name, bool)
    : path_(name), bytes_(std::move(bytes)) {
  parse();
}

SafetensorsFile SafetensorsFile::from_bytes(std::string bytes, const std::string& name) {
  return SafetensorsFile(std::move(bytes), name, true);
}

void SafetensorsFile::parse() {
  const std::string& path = path_;
  const json header = parse_header(bytes_, path, data_start_);
  const uint64_t data_size = bytes_.size() - data_start_;
  std::vector<Range> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      read_metadata(it.value(), path, metadata_);
      continue;
    }
    TensorRecord r = parse_tensor_record(path, it.key(), it.value(), data_size);
    Entry e;
    e.shape = std::move(r.shape);
    e.dtype = r.dtype;
    e.offset = r.begin;
    e.count = r.count;
    e.bytes = r.end - r.begin;
    auto [pos, inserted] = entries_.emplace(it.key(), std::move(e));
    ranges.push_back({r.begin, r.end, &pos->first});
  }
  require_ranges_tile(std::move(ranges), data_size, path);

  // Files from other writers need not keep tensors 4-byte aligned; repack the data section so
  // data() can hand out float pointers without undefined behaviour (F32 tensors first, so that
  // 2-byte tensors cannot misalign them; floats() copies bytes and needs no alignment).
  bool aligned = true;
  for (const auto& [name, e] : entries_)
    if (e.dtype == "F32" &&
        reinterpret_cast<uintptr_t>(bytes_.data() + data_start_ + e.offset) % alignof(float))
      aligned = false;
  if (!aligned) {
    std::string packed;
    packed.reserve(data_size);
    for (const bool f32 : {true, false})
      for (auto& [name, e] : entries_) {
        if ((e.dtype == "F32") != f32) continue;
        const size_t at = packed.size();
        packed.append(bytes_, data_start_ + e.offset, e.bytes);
        e.offset = at;
      }
    bytes_ = std::move(packed);  // heap storage from operator new is suitably aligned
    data_start_ = 0;
  }
}

bool SafetensorsFile::has(const std::string& name) const { return entries_.count(name) != 0; }

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const auto& [name, e] : entries_) out.push_back(name);
  return out;
}

const SafetensorsFile::Entry& SafetensorsFile::entry(const std::string& name) const {
  auto it = entries_.find(name);
  TRELLIS_REQUIRE(it != entries_.end(), "{}: no tensor named '{}'", path_, name);
  return it->second;
}

const std::vector<int64_t>& SafetensorsFile::shape(const std::string& name) const {
  return entry(name).shape;
}

const std::string& SafetensorsFile::dtype(const std::string& name) const {
  return entry(name).dtype;
}

const float* SafetensorsFile::data(const std::string& name) const {
  const Entry& e = entry(name);
  TRELLIS_REQUIRE(e.dtype == "F32", "{}: tensor '{}' is {}, expected F32", path_, name, e.dtype);
  return reinterpret_cast<const float*>(bytes_.data() + data_start_ + e.offset);
}

namespace {

// IEEE half precision to float, exactly (every half is a float).
float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const uint32_t exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  uint32_t bits;
  if (exponent == 0x1f) {  // inf, nan (payload kept)
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {  // normal: rebias 15 -> 127
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {  // signed zero
    bits = sign;
  } else {  // subnormal half: mantissa * 2^-24, a normal float
    int shift = 0;
    uint32_t m = mantissa;
    while (!(m & 0x400)) {
      m <<= 1;
      ++shift;
    }
    bits = sign | (uint32_t(113 - shift) << 23) | ((m & 0x3ff) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace

std::vector<float> SafetensorsFile::floats(const std::string& name) const {
  const Entry& e = entry(name);
  const char* p = bytes_.data() + data_start_ + e.offset;
  TRELLIS_REQUIRE(e.dtype == "F32" || e.dtype == "F16" || e.dtype == "BF16",
                  "{}: tensor '{}' is {}; trellis reads F32, F16 or BF16 weights", path_, name,
                  e.dtype);
  std::vector<float> out(e.count);
  if (e.dtype == "F32") {
    if (e.count > 0) std::memcpy(out.data(), p, e.count * 4);
    return out;
  }
  // Little-endian 16-bit values (trellis only runs on little-endian machines).
  for (size_t i = 0; i < e.count; ++i) {
    uint16_t v;
    std::memcpy(&v, p + 2 * i, 2);
    if (e.dtype == "BF16") {
      const uint32_t bits = uint32_t(v) << 16;  // bfloat16 is a float's upper half
      std::memcpy(&out[i], &bits, 4);
    } else {
      out[i] = half_to_float(v);
    }
  }
  return out;
}

}  // namespace trellis
