#include "trellis/model/params.h"

#include <algorithm>
#include <cmath>

#include "trellis/core/error.h"
#include "trellis/core/philox.h"
#include "trellis/model/family.h"

namespace trellis {

size_t ParamSpec::numel() const {
  size_t n = 1;
  for (int64_t d : shape) n *= size_t(d);
  return n;
}

int64_t ParamSpec::global_index(int64_t i, int tp_rank) const {
  if (split_dim < 0) return i;
  // View the tensor as [outer, D, inner] with D the split dimension.
  int64_t inner = 1;
  for (size_t d = size_t(split_dim) + 1; d < shape.size(); ++d) inner *= shape[d];
  const int64_t D = shape[size_t(split_dim)], Dg = global_shape[size_t(split_dim)];
  const int64_t o = i / (D * inner), d = i / inner % D, in = i % inner;
  const int64_t part_local = D / parts, part_global = Dg / parts;
  const int64_t gd = d / part_local * part_global + int64_t(tp_rank) * part_local + d % part_local;
  return (o * Dg + gd) * inner + in;
}

void ParamLayout::add(ParamSpec s) {
  s.global_shape = s.shape;
  if (s.split_dim >= 0) {
    int64_t& d = s.shape[size_t(s.split_dim)];
    TRELLIS_CHECK(d % (int64_t(tp_) * s.parts) == 0, "{}: dimension {} does not split over tp={}",
                  s.name, d, tp_);
    d /= tp_;
  }
  // Keep every tensor 16-float aligned so views are SIMD/cache friendly.
  size_ = (size_ + 15) / 16 * 16;
  s.offset = size_;
  size_ += s.numel();
  TRELLIS_CHECK(index_.count(s.name) == 0, "parameter '{}' declared twice", s.name);
  index_[s.name] = specs_.size();
  specs_.push_back(std::move(s));
}

StageSpec StageSpec::whole(const ModelConfig& cfg) {
  StageSpec s;
  for (int l = 0; l < cfg.total_layers(); ++l) s.layers.push_back(l);
  return s;
}

ParamLayout::ParamLayout(const ModelConfig& cfg, int tp, int tp_rank, const StageSpec* stage)
    : cfg_(cfg), tp_(tp), tp_rank_(tp_rank), stage_(stage ? *stage : StageSpec::whole(cfg)) {
  TRELLIS_REQUIRE(tp >= 1 && cfg.n_head % tp == 0, "tp={} does not divide the number of heads {}",
                  tp, cfg.n_head);
  TRELLIS_REQUIRE(cfg.kv_heads() % tp == 0,
                  "tp={} does not divide the number of key/value heads {}", tp, cfg.kv_heads());
  TRELLIS_REQUIRE(cfg.ffn() % tp == 0, "tp={} does not divide the MLP width {}", tp, cfg.ffn());
  vocab_local_ = cfg.padded_vocab(tp) / tp;
  const Family& fam = family_of(cfg.arch);
  TRELLIS_REQUIRE(!cfg.encoder_decoder() || fam.encoder_decoder,
                  "model: n_dec_layer={} is for encoder-decoder models (encdec), not {}",
                  cfg.n_dec_layer, cfg.arch);
  TRELLIS_REQUIRE(cfg.encoder_decoder() || !fam.encoder_decoder,
                  "model: {} needs decoder blocks (n_dec_layer >= 1)", cfg.arch);
  ParamBuilder b(*this, false);
  const bool decoder_start =
      cfg.encoder_decoder() && std::count(stage_.layers.begin(), stage_.layers.end(), cfg.n_layer);
  if (stage_.embedding) {
    fam.embedding(b);
  } else if ((stage_.head && cfg.tied_lm_head()) || decoder_start) {
    ParamBuilder copy(*this, true);
    fam.embedding(copy);
  }
  for (int l : stage_.layers) fam.block(b, l);
  if (stage_.head) fam.head(b);
  size_ = (size_ + 15) / 16 * 16;
}

const ParamSpec& ParamLayout::spec(const std::string& name) const {
  auto it = index_.find(name);
  TRELLIS_CHECK(it != index_.end(), "no parameter named '{}'", name);
  return specs_[it->second];
}

const ParamSpec* ParamLayout::find(Slot slot, int layer, bool bias) const {
  for (const auto& s : specs_)
    if (s.slot == slot && s.layer == layer && s.bias == bias) return &s;
  return nullptr;
}

size_t ParamLayout::block_offset(int l) const {
  for (const auto& s : specs_)
    if (s.layer == l) return s.offset;
  TRELLIS_CHECK(false, "block {} is not in this layout", l);
  return 0;
}

int64_t ParamLayout::count() const {
  int64_t n = 0;
  for (const auto& s : specs_) {
    if (s.tied_copy) continue;
    int64_t numel = 1;
    for (int64_t d : s.global_shape) numel *= d;
    const int64_t rows = s.export_rows >= 0 ? s.export_rows : s.global_shape[0];
    n += numel / s.global_shape[0] * rows;
  }
  return n;
}

void ParamBuilder::add(ParamSpec s, Parallel how) {
  if (tied_copy_only_) {
    if (!s.tied) return;
    s.tied_copy = true;
  }
  const bool out_in = s.layout == WeightLayout::OutIn;
  switch (how) {
    case Parallel::None:
      break;
    case Parallel::Vocab:
      s.split_dim = 0;
      break;
    // A bias follows its layer's outputs; a row-parallel layer's bias is added after the sum.
    case Parallel::Column:
      s.split_dim = s.bias || out_in ? 0 : 1;
      break;
    case Parallel::Row:
      s.split_dim = s.bias ? -1 : (out_in ? 1 : 0);
      break;
  }
  if (s.split_dim < 0) s.parts = 1;
  layout_.add(std::move(s));
}

namespace {
ParamSpec named(std::string name, Slot slot, int layer, std::vector<int64_t> shape) {
  ParamSpec p;
  p.name = std::move(name);
  p.slot = slot;
  p.layer = layer;
  p.shape = std::move(shape);
  return p;
}
constexpr float kInitStd = 0.02f;
}  // namespace

void ParamBuilder::token_embedding(const std::string& name) {
  const int64_t Vp = layout_.vocab_local_ * layout_.tp_;
  ParamSpec p = named(name, Slot::TokEmbed, -1, {Vp, cfg_.n_embd});
  p.init_std = kInitStd;
  p.decay = true;
  p.export_rows = p.init_rows = cfg_.vocab_size;
  p.tied = cfg_.tied_lm_head() || cfg_.encoder_decoder();  // reused by the head / decoder start
  p.layout = WeightLayout::OutIn;
  add(std::move(p), Parallel::Vocab);
}

void ParamBuilder::position_embedding(const std::string& name, Slot slot, int layer) {
  ParamSpec p = named(name, slot, layer, {cfg_.block_size, cfg_.n_embd});
  p.init_std = kInitStd;
  p.decay = true;
  add(std::move(p), Parallel::None);
}

void ParamBuilder::head(const std::string& name) {
  const int64_t Vp = layout_.vocab_local_ * layout_.tp_;
  ParamSpec p = named(name, Slot::Head, -1, {Vp, cfg_.n_embd});
  p.init_std = kInitStd;
  p.decay = true;
  p.export_rows = p.init_rows = cfg_.vocab_size;
  p.layout = WeightLayout::OutIn;
  add(std::move(p), Parallel::Vocab);
}

void ParamBuilder::task_head(const std::string& lm_name, const std::string& classifier_weight,
                             const std::string& classifier_bias) {
  if (cfg_.num_classes > 0)
    classifier(classifier_weight, classifier_bias);
  else if (!cfg_.tied_head)
    head(lm_name);
}

void ParamBuilder::classifier(const std::string& weight_name, const std::string& bias_name) {
  ParamSpec w = named(weight_name, Slot::Classifier, -1, {cfg_.num_classes, cfg_.n_embd});
  w.init_std = kInitStd;
  w.decay = true;
  w.layout = WeightLayout::OutIn;
  add(std::move(w), Parallel::None);
  if (bias_name.empty()) return;
  ParamSpec b = named(bias_name, Slot::Classifier, -1, {cfg_.num_classes});
  b.bias = true;
  add(std::move(b), Parallel::None);
}

void ParamBuilder::feature_embedding(const std::string& prefix) {
  ParamSpec w =
      named(prefix + ".weight", Slot::FeatureEmbed, -1, {cfg_.n_embd, cfg_.input_features});
  w.init_std = kInitStd;
  w.decay = true;
  w.layout = WeightLayout::OutIn;
  add(std::move(w), Parallel::None);
  ParamSpec b = named(prefix + ".bias", Slot::FeatureEmbed, -1, {cfg_.n_embd});
  b.bias = true;
  add(std::move(b), Parallel::None);
}

void ParamBuilder::ngram_embedding(const std::string& name) {
  ParamSpec p = named(name, Slot::NgramEmbed, -1, {cfg_.subword_ngrams, cfg_.n_embd});
  p.init_std = kInitStd;
  p.decay = true;
  p.layout = WeightLayout::OutIn;
  add(std::move(p), Parallel::None);
}

void ParamBuilder::norm(Slot slot, int layer, const std::string& prefix) {
  ParamSpec w = named(prefix + ".weight", slot, layer, {cfg_.n_embd});
  w.init_value = 1.0f;
  add(std::move(w), Parallel::None);
  if (cfg_.norm == NormKind::LayerNorm) {
    ParamSpec b = named(prefix + ".bias", slot, layer, {cfg_.n_embd});
    b.bias = true;
    add(std::move(b), Parallel::None);
  }
}

void ParamBuilder::linear(Slot slot, int layer, const std::string& prefix, int64_t in, int64_t out,
                          Parallel how, WeightLayout layout, int parts, bool residual_out) {
  const bool out_in = layout == WeightLayout::OutIn;
  ParamSpec w = named(prefix + ".weight", slot, layer,
                      out_in ? std::vector<int64_t>{out, in} : std::vector<int64_t>{in, out});
  // GPT-2 scales the residual projections by 1/sqrt(2 * n_layer).
  // n_layer counts an encoder-decoder's encoder blocks only; its decoder blocks are scaled alike.
  w.init_std = residual_out ? kInitStd / std::sqrt(2.0f * float(cfg_.n_layer)) : kInitStd;
  w.decay = true;
  w.layout = layout;
  w.parts = parts;
  add(std::move(w), how);
  if (!cfg_.bias) return;
  ParamSpec b = named(prefix + ".bias", slot, layer, {out});
  b.bias = true;
  b.parts = parts;
  b.layout = layout;
  add(std::move(b), how);
}

void ParamBuilder::attention(int l, const std::string& p, const std::string& out_name, bool cross) {
  const int64_t C = cfg_.n_embd, hd = cfg_.head_size(), Q = cfg_.n_head * hd;
  const int64_t KV = cfg_.kv_heads() * hd;
  const auto col = Parallel::Column;
  const auto L = WeightLayout::OutIn;
  linear(cross ? Slot::CrossQ : Slot::Q, l, p + "q_proj", C, Q, col, L);
  linear(cross ? Slot::CrossK : Slot::K, l, p + "k_proj", C, KV, col, L);
  linear(cross ? Slot::CrossV : Slot::V, l, p + "v_proj", C, KV, col, L);
  linear(cross ? Slot::CrossOut : Slot::AttnOut, l, p + out_name, Q, C, Parallel::Row, L, 1, true);
}

void ParamBuilder::mlp(int l, const std::string& gate, const std::string& up,
                       const std::string& down) {
  const int64_t C = cfg_.n_embd, F = cfg_.ffn();
  const auto L = WeightLayout::OutIn;
  if (cfg_.mlp == MlpKind::SwiGLU) {
    linear(Slot::Gate, l, gate, C, F, Parallel::Column, L);
    linear(Slot::Up, l, up, C, F, Parallel::Column, L);
  } else {
    linear(Slot::MlpUp, l, up, C, F, Parallel::Column, L);
  }
  linear(Slot::MlpDown, l, down, F, C, Parallel::Row, L, 1, true);
}

void init_params(const ParamLayout& layout, uint64_t seed, float* params) {
  for (const auto& s : layout.specs()) {
    float* p = params + s.offset;
    const int64_t n = int64_t(s.numel());
    if (s.init_std == 0.0f) {
      for (int64_t i = 0; i < n; ++i) p[i] = s.init_value;
      continue;
    }
    const uint64_t stream = name_hash(s.name);
    int64_t global_numel = 1;
    for (int64_t d : s.global_shape) global_numel *= d;
    const int64_t row_len = global_numel / s.global_shape[0];
    const int64_t drawn = s.init_rows >= 0 ? row_len * s.init_rows : INT64_MAX;
    const int tp_rank = layout.tp_rank();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const int64_t g = s.global_index(i, tp_rank);
      p[i] = g < drawn ? s.init_std * philox_normal(seed, stream, uint64_t(g)) : 0.0f;
    }
  }
}

namespace {
// Calls fn(local offset, global offset) for every element of local that exists in global (the
// vocabulary padding of a tensor-parallel layout may reach past the tp = 1 padding).
template <class Fn>
void for_each_global(const ParamLayout& local, const ParamLayout& global, Fn fn) {
  for (const auto& s : local.specs()) {
    if (!global.has(s.name)) continue;
    const ParamSpec& g = global.spec(s.name);
    const int64_t n = int64_t(s.numel()), limit = int64_t(g.numel());
    for (int64_t i = 0; i < n; ++i) {
      const int64_t gi = s.global_index(i, local.tp_rank());
      if (gi < limit) fn(s.offset + size_t(i), g.offset + size_t(gi));
    }
  }
}
}  // namespace

void copy_from_global(const ParamLayout& local, const ParamLayout& global, const float* src,
                      float* dst) {
  for_each_global(local, global, [&](size_t l, size_t g) { dst[l] = src[g]; });
}

void scatter_to_global(const ParamLayout& local, const ParamLayout& global, const float* src,
                       float* dst) {
  for_each_global(local, global, [&](size_t l, size_t g) { dst[g] = src[l]; });
}

size_t total_size(const std::vector<FlatRange>& ranges) {
  size_t n = 0;
  for (const FlatRange& r : ranges) n += r.size();
  return n;
}

}  // namespace trellis
