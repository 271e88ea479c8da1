// LayerNorm forward/backward (per row over C), statistics in float with a two-pass variance.
#include <algorithm>
#include <cmath>

#include "trellis/kernels/ops.h"

namespace trellis::ops {

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int64_t BT, int64_t C, float eps) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < BT; ++i) {
    const float* x = inp + i * C;
    float m = 0.0f;
    for (int64_t c = 0; c < C; ++c) m += x[c];
    m /= float(C);
    float v = 0.0f;
    for (int64_t c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
    v /= float(C);
    const float s = 1.0f / std::sqrt(v + eps);
    float* y = out + i * C;
    for (int64_t c = 0; c < C; ++c) y[c] = (x[c] - m) * s * weight[c] + bias[c];
    mean[i] = m;
    rstd[i] = s;
  }
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int64_t BT, int64_t C) {
  // Input gradient: rows are independent.
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < BT; ++i) {
    const float* x = inp + i * C;
    const float* dy = dout + i * C;
    const float m = mean[i], s = rstd[i];
    float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
    for (int64_t c = 0; c < C; ++c) {
      const float dn = weight[c] * dy[c];
      dnorm_mean += dn;
      dnorm_norm_mean += dn * (x[c] - m) * s;
    }
    dnorm_mean /= float(C);
    dnorm_norm_mean /= float(C);
    float* dx = dinp + i * C;
    for (int64_t c = 0; c < C; ++c) {
      const float norm = (x[c] - m) * s;
      dx[c] += (weight[c] * dy[c] - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
  }
  // Parameter gradients: columns split across threads (no races).
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < C; c0 += 64) {
    const int64_t c1 = std::min(C, c0 + 64);
    for (int64_t i = 0; i < BT; ++i) {
      const float* x = inp + i * C;
      const float* dy = dout + i * C;
      for (int64_t c = c0; c < c1; ++c) {
        dbias[c] += dy[c];
        dweight[c] += (x[c] - mean[i]) * rstd[i] * dy[c];
      }
    }
  }
}

}  // namespace trellis::ops
