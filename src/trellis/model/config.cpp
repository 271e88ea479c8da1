#include "trellis/model/config.h"

#include <fmt/ranges.h>

#include <cmath>

#include "trellis/core/error.h"
#include "trellis/model/family.h"

namespace trellis {

void ModelConfig::validate() const {
  auto at_most = [](const char* key, int64_t v, int64_t max) {
    TRELLIS_REQUIRE(v <= max, "model: {} = {} is too large (at most {})", key, v, max);
  };
  at_most("n_layer", n_layer, kMaxLayers);
  at_most("n_dec_layer", n_dec_layer, kMaxLayers);
  at_most("n_head", n_head, kMaxHeads);
  at_most("n_kv_head", n_kv_head, kMaxHeads);
  at_most("n_embd", n_embd, kMaxWidth);
  at_most("ffn_hidden", ffn_hidden, kMaxFfn);
  at_most("block_size", block_size, kMaxPositions);
  at_most("vocab_size", vocab_size, kMaxVocab);
  at_most("vocab_multiple", vocab_multiple, kMaxVocab);
  at_most("num_classes", num_classes, kMaxVocab);
  at_most("input_features", input_features, kMaxFeatures);
  at_most("subword_ngrams", subword_ngrams, kMaxVocab);
  const std::pair<const char*, float> dropouts[] = {{"dropout", dropout},
                                                    {"attn_dropout", attn_dropout},
                                                    {"classifier_dropout", classifier_dropout}};
  for (const auto& [key, p] : dropouts)
    TRELLIS_REQUIRE(p >= 0.0f && p < 1.0f, "config key '{}': {} is outside [0, 1)", key, p);
  TRELLIS_REQUIRE(n_layer >= 1, "model: n_layer must be >= 1 (got {})", n_layer);
  TRELLIS_REQUIRE(n_dec_layer >= 0, "model: n_dec_layer must be >= 0 (got {})", n_dec_layer);
  TRELLIS_REQUIRE(n_head >= 1 && n_embd >= 1, "model: n_head and n_embd must be >= 1");
  TRELLIS_REQUIRE(n_embd % n_head == 0, "model: n_head={} does not divide n_embd={}", n_head,
                  n_embd);
  TRELLIS_REQUIRE(n_kv_head >= 0, "model: n_kv_head must be >= 0 (got {})", n_kv_head);
  TRELLIS_REQUIRE(n_head % kv_heads() == 0, "model: n_kv_head={} does not divide n_head={}",
                  kv_heads(), n_head);
  // Finite too: a config.json's 1e300 becomes an infinite float.
  TRELLIS_REQUIRE(norm_eps > 0.0f && std::isfinite(norm_eps),
                  "model: the norm epsilon must be finite and > 0 (got {})", norm_eps);
  TRELLIS_REQUIRE(
      positions != PositionKind::Rope || (rope_theta > 0.0f && std::isfinite(rope_theta)),
      "model: rope_theta must be > 0 (got {})", rope_theta);
  TRELLIS_REQUIRE(positions != PositionKind::Rope || head_size() % 2 == 0,
                  "model: rotary positions need an even head size (got {})", head_size());
  TRELLIS_REQUIRE(ffn_hidden >= 0, "model: ffn_hidden must be >= 0 (got {})", ffn_hidden);
  TRELLIS_REQUIRE(block_size >= 1, "model: block_size must be >= 1 (got {})", block_size);
  TRELLIS_REQUIRE(vocab_size >= 2 || input_features > 0, "model: vocab_size must be >= 2 (got {})",
                  vocab_size);
  TRELLIS_REQUIRE(vocab_multiple >= 1, "model: vocab_multiple must be >= 1");
  TRELLIS_REQUIRE(num_classes != 1 && num_classes >= 0,
                  "model: a classifier needs at least 2 classes (got {})", num_classes);
  TRELLIS_REQUIRE(input_features >= 0, "model: input_features must be >= 0");
  TRELLIS_REQUIRE(input_features == 0 || (arch == "encoder" && num_classes > 0),
                  "model: feature inputs (input_features={}) need an encoder classifier, not {}",
                  input_features, arch);
  TRELLIS_REQUIRE(subword_ngrams >= 0, "config key 'subword_ngrams': must be >= 0 (0 = off)");
  TRELLIS_REQUIRE(subword_ngrams == 0 || (arch == "encoder" && input_features == 0),
                  "config key 'subword_ngrams': subword n-grams are for an encoder over tokens, "
                  "not {}{}",
                  arch, input_features > 0 ? " over feature inputs" : "");
  TRELLIS_REQUIRE(
      subword_ngrams == 0 || (ngram_min >= 1 && ngram_min <= ngram_max && ngram_max <= kMaxNgram),
      "config keys 'ngram_min', 'ngram_max': need 1 <= ngram_min <= ngram_max <= {} "
      "(got {} and {})",
      kMaxNgram, ngram_min, ngram_max);
  TRELLIS_REQUIRE(num_classes == 0 || pooling != Pooling::Cls || !causal,
                  "model: pooling = cls reads the first position, which a causal {} model sees "
                  "alone; use last (or mean)",
                  arch);
  TRELLIS_REQUIRE(mlp != MlpKind::None || arch == "encoder",
                  "model: mlp = none (attention-only blocks) is for the encoder, not {}", arch);
}

const char* pooling_name(Pooling p) {
  return p == Pooling::Cls ? "cls" : p == Pooling::Last ? "last" : "mean";
}

namespace {
struct Preset {
  const char* name;
  const char* arch;
  int n_layer, n_dec_layer, n_head, n_kv_head, n_embd, ffn_hidden, block_size;
};
// Columns: blocks, decoder blocks, heads, kv heads, width, MLP width, context; ffn_hidden 0 =
// 4 * n_embd. llama-baby is about the size of baby (9.5M vs 10.7M parameters at
// the byte vocabulary): grouped-query attention (6 heads over 2) and a SwiGLU MLP of 1024.
constexpr Preset kPresets[] = {
    {"tiny", "gpt2", 2, 0, 2, 0, 32, 0, 64},
    // The default job's: the model that learns most from the built-in corpus in about a minute
    // on two cores (bench/default_job.py), 1.9M parameters at the byte vocabulary.
    {"mini", "gpt2", 4, 0, 4, 0, 192, 0, 128},
    {"baby", "gpt2", 6, 0, 6, 0, 384, 0, 256},
    {"gpt2", "gpt2", 12, 0, 12, 0, 768, 0, 1024},
    {"gpt2-medium", "gpt2", 24, 0, 16, 0, 1024, 0, 1024},
    {"gpt2-large", "gpt2", 36, 0, 20, 0, 1280, 0, 1024},
    {"gpt2-xl", "gpt2", 48, 0, 25, 0, 1600, 0, 1024},
    {"llama-tiny", "llama", 2, 0, 4, 2, 32, 64, 64},
    {"llama-baby", "llama", 6, 0, 6, 2, 384, 1024, 256},
    {"encoder-tiny", "encoder", 2, 0, 2, 0, 32, 0, 64},
    {"encoder-baby", "encoder", 6, 0, 6, 0, 384, 0, 256},
    {"encdec-tiny", "encdec", 2, 2, 2, 0, 32, 0, 64},
    {"encdec-baby", "encdec", 3, 3, 6, 0, 384, 0, 256},
    // Translation: small ones for a CPU, and the original paper's base model (Vaswani et al.
    // 2017: 6 + 6 layers, width 512, 8 heads, MLP 2048; pre-LN and learned positions here).
    {"seq2seq-tiny", "encdec", 2, 2, 4, 0, 64, 0, 128},
    {"seq2seq-baby", "encdec", 3, 3, 8, 0, 256, 1024, 128},
    {"transformer-base", "encdec", 6, 6, 8, 0, 512, 2048, 512},
};
}  // namespace

ModelConfig model_preset(const std::string& name, ModelConfig c) {
  for (const Preset& p : kPresets) {
    if (name != p.name) continue;
    c.arch = p.arch;
    c.n_layer = p.n_layer;
    c.n_dec_layer = p.n_dec_layer;
    c.n_head = p.n_head;
    c.n_kv_head = p.n_kv_head;
    c.n_embd = p.n_embd;
    c.ffn_hidden = p.ffn_hidden;
    c.block_size = p.block_size;
    family_of(c.arch).configure(c);
    return c;
  }
  TRELLIS_REQUIRE(false, "unknown model preset '{}' (choose {})", name,
                  fmt::join(model_preset_names(), ", "));
  return c;
}

nlohmann::json block_choices(const ModelConfig& c) {
  nlohmann::json j = {{"norm", c.norm == NormKind::RMSNorm ? "rmsnorm" : "layernorm"},
                      {"positions", c.positions == PositionKind::Rope ? "rope" : "learned"},
                      {"mlp", c.mlp == MlpKind::SwiGLU ? "swiglu"
                              : c.mlp == MlpKind::None ? "none"
                                                       : "gelu"},
                      {"bias", c.bias},
                      {"tied_head", c.tied_head}};
  if (c.num_classes > 0) {
    j["num_classes"] = c.num_classes;
    j["pooling"] = pooling_name(c.pooling);
    j["input_features"] = c.input_features;
  }
  if (c.subword_ngrams > 0) {
    j["subword_ngrams"] = c.subword_ngrams;
    j["ngram_min"] = c.ngram_min;
    j["ngram_max"] = c.ngram_max;
  }
  return j;
}

void set_block_choices(const nlohmann::json& j, ModelConfig& c, const std::string& where) {
  // A value as the message shows it. Values from flags and --set are raw bytes, which need not be
  // UTF-8: dump() would throw on them (a find of fuzz/fuzz_config), so they are shown with U+FFFD.
  auto shown = [&](const char* key) {
    return j[key].dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  };
  // The index of j[key] among the choices; -1 when absent or empty.
  auto text = [&](const char* key, std::initializer_list<const char*> choices) -> int {
    if (!j.contains(key) || j[key] == "") return -1;
    int i = 0;
    for (const char* c : choices) {
      if (j[key] == c) return i;
      ++i;
    }
    TRELLIS_REQUIRE(false, "{}: {} must be {} (got {})", where, key, fmt::join(choices, " or "),
                    shown(key));
    return -1;
  };
  auto number = [&](const char* key, int& out) {
    if (!j.contains(key)) return;
    TRELLIS_REQUIRE(j[key].is_number_integer() && j[key] >= 0 && j[key] <= kMaxVocab,
                    "{}: {} must be an integer between 0 and {} (got {})", where, key, kMaxVocab,
                    shown(key));
    out = j[key].get<int>();
  };
  auto flag = [&](const char* key, bool& out) {
    if (!j.contains(key) || j[key] == "") return;
    TRELLIS_REQUIRE(j[key].is_boolean() || j[key] == "true" || j[key] == "false",
                    "{}: {} must be true or false (got {})", where, key, shown(key));
    out = j[key] == true || j[key] == "true";
  };
  if (const int v = text("norm", {"layernorm", "rmsnorm"}); v >= 0)
    c.norm = v ? NormKind::RMSNorm : NormKind::LayerNorm;
  if (const int v = text("positions", {"learned", "rope"}); v >= 0)
    c.positions = v ? PositionKind::Rope : PositionKind::Learned;
  if (const int v = text("mlp", {"gelu", "swiglu", "none"}); v >= 0) c.mlp = MlpKind(v);
  flag("bias", c.bias);
  flag("tied_head", c.tied_head);
  number("num_classes", c.num_classes);
  number("input_features", c.input_features);
  number("subword_ngrams", c.subword_ngrams);
  number("ngram_min", c.ngram_min);
  number("ngram_max", c.ngram_max);
  if (const int v = text("pooling", {"mean", "cls", "last"}); v >= 0) c.pooling = Pooling(v);
}

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.push_back(p.name);
  return names;
}

}  // namespace trellis
