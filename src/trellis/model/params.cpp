#include "trellis/model/params.h"

#include <cmath>

#include "trellis/core/error.h"
#include "trellis/core/philox.h"

namespace trellis {

size_t ParamSpec::numel() const {
  size_t n = 1;
  for (int64_t d : shape) n *= size_t(d);
  return n;
}

int64_t ParamSpec::global_index(int64_t i, int tp_rank) const {
  if (split == TpSplit::None) return i;
  const int64_t cols = shape.size() == 1 ? shape[0] : shape[1];
  const int64_t gcols = global_shape.size() == 1 ? global_shape[0] : global_shape[1];
  const int64_t r = i / cols, c = i % cols;
  if (split == TpSplit::Rows) return (int64_t(tp_rank) * shape[0] + r) * gcols + c;
  const int64_t part_local = cols / parts, part_global = gcols / parts;
  const int64_t p = c / part_local, j = c % part_local;
  return r * gcols + p * part_global + int64_t(tp_rank) * part_local + j;
}

void ParamLayout::add(ParamSpec s) {
  s.global_shape = s.shape;
  if (s.split == TpSplit::Rows) {
    s.shape[0] /= tp_;
  } else if (s.split == TpSplit::Columns) {
    s.shape.back() /= tp_;
  }
  // Keep every tensor 16-float aligned so views are SIMD/cache friendly.
  size_ = (size_ + 15) / 16 * 16;
  s.offset = size_;
  size_ += s.numel();
  index_[s.name] = specs_.size();
  specs_.push_back(std::move(s));
}

StageSpec StageSpec::whole(const ModelConfig& cfg) {
  StageSpec s;
  for (int l = 0; l < cfg.n_layer; ++l) s.layers.push_back(l);
  return s;
}

ParamLayout::ParamLayout(const ModelConfig& cfg, int tp, int tp_rank, const StageSpec* stage)
    : tp_(tp), tp_rank_(tp_rank), stage_(stage ? *stage : StageSpec::whole(cfg)) {
  TRELLIS_REQUIRE(tp >= 1 && cfg.n_head % tp == 0, "tp={} does not divide the number of heads {}",
                  tp, cfg.n_head);
  const int64_t C = cfg.n_embd, V = cfg.vocab_size;
  // The vocabulary is padded so that every tensor-parallel rank holds the same number of rows.
  const int64_t multiple = int64_t(cfg.vocab_multiple) * tp;
  const int64_t Vp = (V + multiple - 1) / multiple * multiple;
  vocab_local_ = Vp / tp;
  const float std = 0.02f;
  // GPT-2 scales the residual projections by 1/sqrt(2 * n_layer).
  const float proj_std = 0.02f / std::sqrt(2.0f * float(cfg.n_layer));
  auto weight = [](std::string n, std::vector<int64_t> shape, float s) {
    ParamSpec p;
    p.name = std::move(n);
    p.shape = std::move(shape);
    p.init_std = s;
    p.decay = true;
    return p;
  };
  auto constant = [](std::string n, int64_t len, float v) {
    ParamSpec p;
    p.name = std::move(n);
    p.shape = {len};
    p.init_value = v;
    return p;
  };
  auto split = [](ParamSpec p, TpSplit how, int parts = 1) {
    p.split = how;
    p.parts = parts;
    return p;
  };
  ParamSpec wte = split(weight("wte.weight", {Vp, C}, std), TpSplit::Rows);
  wte.export_rows = V;
  wte.init_rows = V;
  if (stage_.embedding || stage_.head) add(wte);
  if (stage_.embedding) add(weight("wpe.weight", {cfg.block_size, C}, std));
  for (int l : stage_.layers) {
    const std::string h = "h." + std::to_string(l) + ".";
    add(constant(h + "ln_1.weight", C, 1.0f));
    add(constant(h + "ln_1.bias", C, 0.0f));
    add(split(weight(h + "attn.c_attn.weight", {C, 3 * C}, std), TpSplit::Columns, 3));
    add(split(constant(h + "attn.c_attn.bias", 3 * C, 0.0f), TpSplit::Columns, 3));
    add(split(weight(h + "attn.c_proj.weight", {C, C}, proj_std), TpSplit::Rows));
    add(constant(h + "attn.c_proj.bias", C, 0.0f));
    add(constant(h + "ln_2.weight", C, 1.0f));
    add(constant(h + "ln_2.bias", C, 0.0f));
    add(split(weight(h + "mlp.c_fc.weight", {C, 4 * C}, std), TpSplit::Columns));
    add(split(constant(h + "mlp.c_fc.bias", 4 * C, 0.0f), TpSplit::Columns));
    add(split(weight(h + "mlp.c_proj.weight", {4 * C, C}, proj_std), TpSplit::Rows));
    add(constant(h + "mlp.c_proj.bias", C, 0.0f));
  }
  if (stage_.head) {
    add(constant("ln_f.weight", C, 1.0f));
    add(constant("ln_f.bias", C, 0.0f));
  }
  size_ = (size_ + 15) / 16 * 16;
}

const ParamSpec& ParamLayout::spec(const std::string& name) const {
  auto it = index_.find(name);
  TRELLIS_CHECK(it != index_.end(), "no parameter named '{}'", name);
  return specs_[it->second];
}

size_t ParamLayout::block_offset(int l) const {
  return spec("h." + std::to_string(l) + ".ln_1.weight").offset;
}

int64_t ParamLayout::count() const {
  int64_t n = 0;
  for (const auto& s : specs_) {
    int64_t numel = 1;
    for (int64_t d : s.global_shape) numel *= d;
    const int64_t rows = s.export_rows >= 0 ? s.export_rows : s.global_shape[0];
    n += numel / s.global_shape[0] * rows;
  }
  return n;
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
    const int64_t row_len = int64_t(s.numel()) / s.shape[0] * s.global_shape[0] /
                            (s.split == TpSplit::Rows ? s.global_shape[0] : s.shape[0]);
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

}  // namespace trellis
