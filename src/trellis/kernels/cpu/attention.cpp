// Causal self-attention per (batch, head) with small GEMMs; the softmax probabilities are saved
// for backward (T x T per head: fine at GPT-2 context lengths on a CPU).
#include <algorithm>
#include <cmath>
#include <vector>

#include "trellis/kernels/cpu/simd_math.h"
#include "trellis/kernels/ops.h"

namespace trellis::ops {

namespace {
// In place: row[0, n) <- softmax(row[0, n)), row[n, T) <- 0. The exponentials go through
// simd::exp (double, 4 lanes) and are summed in double with a fixed lane order.
void softmax_causal_row(float* row, int64_t n, int64_t T) {
  float mx = row[0];
  for (int64_t j = 1; j < n; ++j) mx = std::max(mx, row[j]);
  const simd::d4 mx4 = simd::splat(double(mx));
  simd::d4 acc = {};
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    const simd::d4 e = simd::exp(simd::load4(row + j) - mx4);
    simd::store4(row + j, e);
    acc += simd::load4(row + j);  // the rounded values, as normalised below
  }
  double sum = (acc[0] + acc[1]) + (acc[2] + acc[3]);
  for (; j < n; ++j) {
    row[j] = float(std::exp(double(row[j]) - double(mx)));
    sum += double(row[j]);
  }
  const float inv = float(1.0 / sum);
  for (j = 0; j < n; ++j) row[j] *= inv;
  for (j = n; j < T; ++j) row[j] = 0.0f;
}
}  // namespace

void attention_forward(float* out, float* probs, const float* qkv, int64_t B, int64_t T, int64_t C,
                       int64_t H) {
  const int64_t hs = C / H, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(float(hs));
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t bh = 0; bh < B * H; ++bh) {
    const int64_t b = bh / H, h = bh % H;
    const float* q = qkv + b * T * C3 + h * hs;
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* p = probs + bh * T * T;
    gemm(false, true, T, T, hs, scale, q, C3, k, C3, 0.0f, p, T);
    for (int64_t i = 0; i < T; ++i) softmax_causal_row(p + i * T, i + 1, T);
    gemm(false, false, T, hs, T, 1.0f, p, T, v, C3, 0.0f, out + b * T * C + h * hs, C);
  }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* probs,
                        int64_t B, int64_t T, int64_t C, int64_t H) {
  const int64_t hs = C / H, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(float(hs));
#pragma omp parallel
  {
    std::vector<float> dp(size_t(T * T));
#pragma omp for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < B * H; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      const int64_t off = b * T * C3 + h * hs;
      const float* q = qkv + off;
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* dq = dqkv + off;
      float* dk = dq + C;
      float* dv = dq + 2 * C;
      const float* p = probs + bh * T * T;
      const float* dy = dout + b * T * C + h * hs;
      gemm(false, true, T, T, hs, 1.0f, dy, C, v, C3, 0.0f, dp.data(), T);  // dP = dY V^T
      gemm(true, false, T, hs, T, 1.0f, p, T, dy, C, 1.0f, dv, C3);         // dV += P^T dY
      // Softmax backward, with the 1/sqrt(hs) of the scores folded in: dS = P*(dP - <P,dP>).
      for (int64_t i = 0; i < T; ++i) {
        const float* prow = p + i * T;
        float* drow = dp.data() + i * T;
        float dot = 0.0f;
        for (int64_t j = 0; j <= i; ++j) dot += prow[j] * drow[j];
        for (int64_t j = 0; j <= i; ++j) drow[j] = prow[j] * (drow[j] - dot) * scale;
        for (int64_t j = i + 1; j < T; ++j) drow[j] = 0.0f;
      }
      gemm(false, false, T, hs, T, 1.0f, dp.data(), T, k, C3, 1.0f, dq, C3);  // dQ += dS K
      gemm(true, false, T, hs, T, 1.0f, dp.data(), T, q, C3, 1.0f, dk, C3);   // dK += dS^T Q
    }
  }
}

}  // namespace trellis::ops
