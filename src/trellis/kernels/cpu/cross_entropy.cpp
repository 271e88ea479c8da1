// Fused softmax + cross-entropy over the true vocabulary; padding columns get zero gradient.
#include <algorithm>
#include <cmath>

#include "trellis/core/error.h"

#include "trellis/kernels/ops.h"

namespace trellis::ops {

double cross_entropy(float* logits, float* losses, const int32_t* targets, int64_t BT, int64_t V,
                     int64_t Vp, float grad_scale) {
  for (int64_t i = 0; i < BT; ++i)
    TRELLIS_CHECK(targets[i] >= 0 && targets[i] < V, "target {} outside the vocabulary of {}",
                  targets[i], V);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < BT; ++i) {
    float* row = logits + i * Vp;
    float mx = row[0];
    for (int64_t j = 1; j < V; ++j) mx = std::max(mx, row[j]);
    double sum = 0.0;
    for (int64_t j = 0; j < V; ++j) sum += std::exp(double(row[j] - mx));
    const double lse = double(mx) + std::log(sum);
    const int32_t t = targets[i];
    losses[i] = float(lse - double(row[t]));
    if (grad_scale != 0.0f) {
      const float inv = float(1.0 / sum);
      for (int64_t j = 0; j < V; ++j) row[j] = grad_scale * std::exp(row[j] - mx) * inv;
      row[t] -= grad_scale;
      for (int64_t j = V; j < Vp; ++j) row[j] = 0.0f;
    }
  }
  // Summed in row order after the parallel loop, so the total is reproducible.
  double total = 0.0;
  for (int64_t i = 0; i < BT; ++i) total += losses[i];
  return total;
}

}  // namespace trellis::ops
