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

void ParamLayout::add(ParamSpec s) {
  // Keep every tensor 16-float aligned so views are SIMD/cache friendly.
  size_ = (size_ + 15) / 16 * 16;
  s.offset = size_;
  size_ += s.numel();
  index_[s.name] = specs_.size();
  specs_.push_back(std::move(s));
}

ParamLayout::ParamLayout(const ModelConfig& cfg) {
  const int64_t C = cfg.n_embd, V = cfg.vocab_size, Vp = cfg.padded_vocab();
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
  ParamSpec wte = weight("wte.weight", {Vp, C}, std);
  wte.export_rows = V;
  wte.init_rows = V;
  add(wte);
  add(weight("wpe.weight", {cfg.block_size, C}, std));
  for (int l = 0; l < cfg.n_layer; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    add(constant(h + "ln_1.weight", C, 1.0f));
    add(constant(h + "ln_1.bias", C, 0.0f));
    add(weight(h + "attn.c_attn.weight", {C, 3 * C}, std));
    add(constant(h + "attn.c_attn.bias", 3 * C, 0.0f));
    add(weight(h + "attn.c_proj.weight", {C, C}, proj_std));
    add(constant(h + "attn.c_proj.bias", C, 0.0f));
    add(constant(h + "ln_2.weight", C, 1.0f));
    add(constant(h + "ln_2.bias", C, 0.0f));
    add(weight(h + "mlp.c_fc.weight", {C, 4 * C}, std));
    add(constant(h + "mlp.c_fc.bias", 4 * C, 0.0f));
    add(weight(h + "mlp.c_proj.weight", {4 * C, C}, proj_std));
    add(constant(h + "mlp.c_proj.bias", C, 0.0f));
  }
  add(constant("ln_f.weight", C, 1.0f));
  add(constant("ln_f.bias", C, 0.0f));
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
    const int64_t rows = s.export_rows >= 0 ? s.export_rows : s.shape[0];
    n += int64_t(s.numel()) / s.shape[0] * rows;
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
    const int64_t drawn = s.init_rows >= 0 ? n / s.shape[0] * s.init_rows : n;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i)
      p[i] = i < drawn ? s.init_std * philox_normal(seed, stream, uint64_t(i)) : 0.0f;
  }
}

}  // namespace trellis
