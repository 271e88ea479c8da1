#include "trellis/optim/optimizer.h"

#include <cmath>

#include "trellis/core/error.h"

namespace trellis {

float learning_rate(const OptimConfig& c, int64_t step, int64_t total_steps) {
  if (c.warmup_steps > 0 && step <= c.warmup_steps)
    return c.lr * float(step) / float(c.warmup_steps);
  const int64_t decay_steps = total_steps - c.warmup_steps;
  if (decay_steps <= 0) return c.lr;
  const double progress = std::min(1.0, double(step - c.warmup_steps) / double(decay_steps));
  const double coeff = 0.5 * (1.0 + std::cos(M_PI * progress));
  return float(c.min_lr + coeff * (c.lr - c.min_lr));
}

Optimizer::Optimizer(const OptimConfig& cfg, const ParamLayout& layout, size_t begin, size_t end)
    : cfg_(cfg), begin_(begin), end_(end) {
  TRELLIS_REQUIRE(cfg.name == "adamw" || cfg.name == "sgd",
                  "optimizer must be 'adamw' or 'sgd' (got '{}')", cfg.name);
  decay_.assign(end - begin, 0);
  for (const auto& s : layout.specs()) {
    if (!s.decay) continue;
    const size_t lo = std::max(begin, s.offset), hi = std::min(end, s.offset + s.numel());
    for (size_t i = lo; i < hi; ++i) decay_[i - begin] = 1;
  }
  m_.assign(end - begin, 0.0f);
  if (cfg.name == "adamw") v_.assign(end - begin, 0.0f);
}

void Optimizer::step(float* params, const float* grads, float lr, int64_t t) {
  const int64_t n = int64_t(end_ - begin_);
  float* p = params + begin_;
  const float* g = grads + begin_;
  float* m = m_.data();
  const uint8_t* dk = decay_.data();
  if (cfg_.name == "adamw") {
    // Same arithmetic as torch.optim.AdamW (foreach=False): decay first, then the Adam step.
    float* v = v_.data();
    const float b1 = cfg_.beta1, b2 = cfg_.beta2, eps = cfg_.eps;
    const float bc1 = 1.0f - std::pow(b1, float(t));
    const float bc2_sqrt = std::sqrt(1.0f - std::pow(b2, float(t)));
    const float step_size = lr / bc1;
    const float decay_mul = 1.0f - lr * cfg_.weight_decay;
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      float pi = dk[i] ? p[i] * decay_mul : p[i];
      m[i] = b1 * m[i] + (1.0f - b1) * g[i];
      v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
      const float denom = std::sqrt(v[i]) / bc2_sqrt + eps;
      p[i] = pi - step_size * (m[i] / denom);
    }
  } else {
    // torch.optim.SGD: coupled weight decay, momentum buffer initialised to the first gradient.
    const float mu = cfg_.momentum, wd = cfg_.weight_decay;
    const bool first = t == 1;
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float gi = dk[i] ? g[i] + wd * p[i] : g[i];
      m[i] = first ? gi : mu * m[i] + gi;
      p[i] -= lr * (mu != 0.0f ? m[i] : gi);
    }
  }
}

std::vector<std::pair<std::string, std::vector<float>*>> Optimizer::state() {
  if (cfg_.name == "adamw") return {{"exp_avg", &m_}, {"exp_avg_sq", &v_}};
  return {{"momentum_buffer", &m_}};
}

size_t Optimizer::state_bytes() const { return (m_.size() + v_.size()) * sizeof(float); }

}  // namespace trellis
