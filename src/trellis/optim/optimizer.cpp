#include "trellis/optim/optimizer.h"

#include <algorithm>
#include <cmath>

#include "trellis/core/bf16.h"
#include "trellis/core/error.h"

namespace trellis {

LrSchedule parse_lr_schedule(const std::string& name) {
  if (name == "cosine") return LrSchedule::Cosine;
  if (name == "linear") return LrSchedule::Linear;
  if (name == "constant") return LrSchedule::Constant;
  if (name == "inverse_sqrt") return LrSchedule::InverseSqrt;
  TRELLIS_REQUIRE(false,
                  "config key 'lr_schedule': unknown schedule '{}' (choose cosine, linear, "
                  "constant or inverse_sqrt)",
                  name);
  return LrSchedule::Cosine;
}

int64_t warmup_steps_for(const OptimConfig& c, int64_t total_steps) {
  TRELLIS_REQUIRE(c.warmup_steps >= -1,
                  "config key 'warmup_steps': {} is negative (-1 = a tenth of the steps)",
                  c.warmup_steps);
  if (c.warmup_steps >= 0) return c.warmup_steps;
  return std::clamp<int64_t>((total_steps + 5) / 10, 1, 2000);
}

float learning_rate(const OptimConfig& c, int64_t step, int64_t total_steps) {
  const LrSchedule kind = parse_lr_schedule(c.lr_schedule);
  const int64_t warmup = warmup_steps_for(c, total_steps);
  if (warmup > 0 && step <= warmup) return c.lr * float(step) / float(warmup);
  switch (kind) {
    case LrSchedule::Constant:
      return c.lr;
    case LrSchedule::InverseSqrt:
      return float(double(c.lr) * std::sqrt(double(std::max<int64_t>(warmup, 1)) / double(step)));
    case LrSchedule::Cosine:
    case LrSchedule::Linear:
      break;
  }
  const int64_t decay_steps = total_steps - warmup;
  if (decay_steps <= 0) return c.lr;
  const double progress = std::min(1.0, double(step - warmup) / double(decay_steps));
  const double coeff =
      kind == LrSchedule::Cosine ? 0.5 * (1.0 + std::cos(M_PI * progress)) : 1.0 - progress;
  return float(c.min_lr + coeff * (c.lr - c.min_lr));
}

Optimizer::Optimizer(const OptimConfig& cfg, const ParamLayout& layout,
                     std::vector<FlatRange> owned)
    : cfg_(cfg), owned_(std::move(owned)) {
  TRELLIS_REQUIRE(cfg.name == "adamw" || cfg.name == "sgd",
                  "optimizer must be 'adamw' or 'sgd' (got '{}')", cfg.name);
  TRELLIS_CHECK(!owned_.empty(), "optimizer: no owned ranges");
  const size_t n = total_size(owned_);
  std::vector<uint8_t> decay(n, 0);
  size_t at = 0;  // compact offset of the current range
  for (const FlatRange& r : owned_) {
    for (const auto& s : layout.specs()) {
      if (!s.decay) continue;
      const size_t lo = std::max(r.begin, s.offset), hi = std::min(r.end, s.offset + s.numel());
      for (size_t i = lo; i < hi; ++i) decay[at + i - r.begin] = 1;
    }
    at += r.size();
  }
  // Few runs (one per tensor at most) instead of a flag per element: the update streams less.
  for (size_t i = 0; i < decay.size();) {
    size_t j = i;
    while (j < decay.size() && decay[j] == decay[i]) ++j;
    runs_.push_back({i, j, decay[i] != 0});
    i = j;
  }
  m_.assign(n, 0.0f);
  if (state_tensors(cfg.name) == 2) v_.assign(n, 0.0f);
}

int Optimizer::state_tensors(const std::string& name) { return name == "adamw" ? 2 : 1; }

namespace {

// Element-wise updates over [lo, hi) with one decay flag. Plain loops over __restrict pointers
// without branches, so the compiler vectorises them; per element the arithmetic is that of
// torch.optim (foreach=False), so results do not depend on threads or chunking.
struct AdamW {
  float b1, b2, eps, bc2_sqrt, step_size, decay_mul, grad_mul;
  void operator()(float* __restrict p, const float* __restrict g, float* __restrict m,
                  float* __restrict v, size_t n, bool decay) const {
    const float dm = decay ? decay_mul : 1.0f;
    const bool scaled = grad_mul != 1.0f;
    for (size_t i = 0; i < n; ++i) {
      const float gi = scaled ? g[i] * grad_mul : g[i];
      const float pi = decay ? p[i] * dm : p[i];
      const float mi = b1 * m[i] + (1.0f - b1) * gi;
      const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
      m[i] = mi;
      v[i] = vi;
      const float denom = std::sqrt(vi) / bc2_sqrt + eps;
      p[i] = pi - step_size * (mi / denom);
    }
  }
};

struct Sgd {
  float lr, mu, wd, grad_mul;
  bool first;
  void operator()(float* __restrict p, const float* __restrict g, float* __restrict m, size_t n,
                  bool decay) const {
    const bool scaled = grad_mul != 1.0f;
    for (size_t i = 0; i < n; ++i) {
      const float g0 = scaled ? g[i] * grad_mul : g[i];
      // An explicit fma keeps g0 rounded on its own, as if the gradients had been scaled first
      // (left to itself the compiler may contract g * grad_mul into the decay's add instead).
      const float gi = decay ? std::fma(wd, p[i], g0) : g0;
      const float mi = first ? gi : mu * m[i] + gi;
      m[i] = mi;
      p[i] -= lr * (mu != 0.0f ? mi : gi);
    }
  }
};

}  // namespace

void Optimizer::step(float* params, const float* grads, float lr, int64_t t, float grad_mul) {
  TRELLIS_CHECK(owned_.size() == 1, "optimizer: step over whole buffers needs one owned range");
  step_compact(params + owned_[0].begin, grads + owned_[0].begin, lr, t, grad_mul);
}

void Optimizer::step_compact(float* p, const float* g, float lr, int64_t t, float grad_mul) {
  sweep(p, g, nullptr, lr, t, grad_mul);
}

void Optimizer::step_compact(float* p, const uint16_t* g, float lr, int64_t t, float grad_mul) {
  sweep(p, nullptr, g, lr, t, grad_mul);
}

void Optimizer::sweep(float* p, const float* g32, const uint16_t* g16, float lr, int64_t t,
                      float grad_mul) {
  const size_t n = m_.size();
  float* m = m_.data();
  float* v = v_.data();
  const bool adamw = cfg_.name == "adamw";
  // Same arithmetic as torch.optim.AdamW (foreach=False): decay first, then the Adam step.
  const float b1 = cfg_.beta1, b2 = cfg_.beta2;
  const AdamW adam{b1,
                   b2,
                   cfg_.eps,
                   std::sqrt(1.0f - std::pow(b2, float(t))),
                   lr / (1.0f - std::pow(b1, float(t))),
                   1.0f - lr * cfg_.weight_decay,
                   grad_mul};
  // torch.optim.SGD: coupled weight decay, momentum buffer initialised to the first gradient.
  const Sgd sgd{lr, cfg_.momentum, cfg_.weight_decay, grad_mul, t == 1};
  constexpr size_t kChunk = 16384;
  const int64_t chunks = int64_t((n + kChunk - 1) / kChunk);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const size_t lo = size_t(c) * kChunk, hi = std::min(n, lo + kChunk);
    // bf16 gradients are widened a chunk at a time (the ZeRO-0 bf16 storage keeps no fp32 copy).
    float widened[kChunk];
    if (g16)
      for (size_t k = lo; k < hi; ++k) widened[k - lo] = widen_bf16(g16[k]);
    const float* g = g16 ? widened : g32 + lo;  // the chunk's gradients, from lo
    // First run that ends after lo (runs are sorted and cover [0, n)).
    auto r = std::upper_bound(runs_.begin(), runs_.end(), lo,
                              [](size_t x, const Run& run) { return x < run.hi; });
    for (size_t i = lo; i < hi; ++r) {
      const size_t j = std::min(hi, r->hi);
      if (adamw)
        adam(p + i, g + (i - lo), m + i, v + i, j - i, r->decay);
      else
        sgd(p + i, g + (i - lo), m + i, j - i, r->decay);
      i = j;
    }
  }
}

std::vector<std::pair<std::string, std::vector<float>*>> Optimizer::state() {
  if (cfg_.name == "adamw") return {{"exp_avg", &m_}, {"exp_avg_sq", &v_}};
  return {{"momentum_buffer", &m_}};
}

size_t Optimizer::state_bytes() const { return (m_.size() + v_.size()) * sizeof(float); }

}  // namespace trellis
