#include "trellis/model/family.h"

#include <fmt/ranges.h>

#include <string>

#include "trellis/core/error.h"

namespace trellis {

extern const Family kGpt2Family, kLlamaFamily, kEncoderFamily, kEncDecFamily;

namespace {
const Family* const kFamilies[] = {&kGpt2Family, &kLlamaFamily, &kEncoderFamily, &kEncDecFamily};
}

const Family& family_of(const std::string& arch) {
  std::vector<std::string> names;
  for (const Family* f : kFamilies) {
    if (arch == f->arch) return *f;
    names.emplace_back(f->arch);
  }
  TRELLIS_REQUIRE(false, "unknown model architecture '{}' (choose {})", arch,
                  fmt::join(names, ", "));
  return kGpt2Family;
}

const Family& family_of_hf_config(const nlohmann::json& j, const std::string& path) {
  if (!j.contains("model_type")) return kGpt2Family;
  for (const Family* f : kFamilies)
    if (j["model_type"] == f->model_type) return *f;
  TRELLIS_REQUIRE(false, "{}: model_type {} is not one trellis trains (gpt2, llama, {}, {})", path,
                  j["model_type"].dump(), kEncoderFamily.model_type, kEncDecFamily.model_type);
  return kGpt2Family;
}

double json_number(float v) { return std::stod(fmt::format("{}", v)); }

void HfConfigReader::expect(const char* key, const nlohmann::json& value, const char* why) const {
  TRELLIS_REQUIRE(!has(key) || j_.at(key) == value, "{}: {} is {}; trellis supports {} ({})", path_,
                  key, j_.at(key).dump(), value.dump(), why);
}

int HfConfigReader::get_int(const char* key, int lo, int hi) const {
  TRELLIS_REQUIRE(has(key), "{}: missing key '{}'", path_, key);
  const nlohmann::json& v = j_.at(key);
  TRELLIS_REQUIRE(v.is_number_integer(), "{}: key '{}' must be an integer (got {})", path_, key,
                  v.dump());
  // An unsigned value above int64's range would wrap in get<int64_t>().
  const bool in_range = v.is_number_unsigned() ? v.get<uint64_t>() <= uint64_t(hi)
                                               : v.get<int64_t>() >= lo && v.get<int64_t>() <= hi;
  TRELLIS_REQUIRE(in_range, "{}: key '{}' is {}; it must be between {} and {}", path_, key,
                  v.dump(), lo, hi);
  return int(v.get<int64_t>());
}

void read_common_sizes(const HfConfigReader& r, ModelConfig& m) {
  m.n_embd = r.get_int("hidden_size", 1, kMaxWidth);
  m.ffn_hidden = r.get_int("intermediate_size", 0, kMaxFfn);
  m.n_head = r.get_int("num_attention_heads", 1, kMaxHeads);
  m.n_kv_head = r.has("num_key_value_heads") ? r.get_int("num_key_value_heads", 0, kMaxHeads) : 0;
  m.n_layer = r.get_int("num_hidden_layers", 1, kMaxLayers);
  m.block_size = r.get_int("max_position_embeddings", 1, kMaxPositions);
  m.vocab_size = r.get_int("vocab_size", 1, kMaxVocab);
}

double HfConfigReader::get_number(const char* key) const {
  TRELLIS_REQUIRE(has(key), "{}: missing key '{}'", path_, key);
  TRELLIS_REQUIRE(j_.at(key).is_number(), "{}: key '{}' must be a number", path_, key);
  return j_.at(key).get<double>();
}

bool HfConfigReader::get_bool(const char* key) const {
  TRELLIS_REQUIRE(has(key), "{}: missing key '{}'", path_, key);
  TRELLIS_REQUIRE(j_.at(key).is_boolean(), "{}: key '{}' must be true or false", path_, key);
  return j_.at(key).get<bool>();
}

}  // namespace trellis
