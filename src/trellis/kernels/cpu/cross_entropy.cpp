// Softmax + cross-entropy over the true vocabulary, optionally with the vocabulary split across
// ranks (Megatron's vocab-parallel cross-entropy: row max, sum of exps and target logit are
// combined, the full logits never are). Padding columns get zero gradient.
#include <algorithm>
#include <cmath>
#include <vector>

#include "trellis/core/error.h"
#include "trellis/kernels/ops.h"

namespace trellis::ops {

double cross_entropy(float* logits, float* losses, const int32_t* targets, int64_t BT,
                     int64_t valid, int64_t ld, int64_t vocab_start, float grad_scale,
                     const RowCombine& combine) {
  TRELLIS_CHECK(valid >= 0 && valid <= ld, "cross_entropy: {} valid of {} columns", valid, ld);
  // stats: [0,BT) row max, [BT,2BT) sum of exp(x - max), [2BT,3BT) target logit (0 if not ours).
  std::vector<double> stats(size_t(3 * BT), 0.0);
  double* mx = stats.data();
  double* sum = mx + BT;
  double* target_logit = sum + BT;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < BT; ++i) {
    const float* row = logits + i * ld;
    float m = -INFINITY;
    for (int64_t j = 0; j < valid; ++j) m = std::max(m, row[j]);
    mx[i] = m;
  }
  if (combine) combine(mx, BT, true);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < BT; ++i) {
    const float* row = logits + i * ld;
    const float m = float(mx[i]);
    double s = 0.0;
    for (int64_t j = 0; j < valid; ++j) s += std::exp(double(row[j] - m));
    sum[i] = s;
    const int64_t t = int64_t(targets[i]) - vocab_start;
    target_logit[i] = t >= 0 && t < valid ? double(row[t]) : 0.0;
  }
  if (combine) combine(sum, 2 * BT, false);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < BT; ++i) {
    losses[i] = float(mx[i] + std::log(sum[i]) - target_logit[i]);
    if (grad_scale == 0.0f) continue;
    float* row = logits + i * ld;
    const float m = float(mx[i]);
    const float inv = float(1.0 / sum[i]);
    for (int64_t j = 0; j < valid; ++j) row[j] = grad_scale * std::exp(row[j] - m) * inv;
    for (int64_t j = valid; j < ld; ++j) row[j] = 0.0f;
    const int64_t t = int64_t(targets[i]) - vocab_start;
    if (t >= 0 && t < valid) row[t] -= grad_scale;
  }
  // Summed in row order after the parallel loops, so the total is reproducible.
  double total = 0.0;
  for (int64_t i = 0; i < BT; ++i) total += losses[i];
  return total;
}

}  // namespace trellis::ops
