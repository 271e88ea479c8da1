// RMSNorm forward/backward (per row over C). Row statistics are summed in double: the mean of
// squares has no cancellation to fear, but C-term float sums lose ~C*u of it at LLaMA widths.
#include <algorithm>
#include <cmath>

#include "trellis/kernels/ops.h"

namespace trellis::ops {

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int64_t rows,
                     int64_t C, float eps) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < rows; ++i) {
    const float* x = inp + i * C;
    double ss = 0.0;
    for (int64_t c = 0; c < C; ++c) ss += double(x[c]) * double(x[c]);
    const float s = float(1.0 / std::sqrt(ss / double(C) + double(eps)));
    float* y = out + i * C;
    for (int64_t c = 0; c < C; ++c) y[c] = x[c] * s * weight[c];
    rstd[i] = s;
  }
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int64_t rows, int64_t C) {
  // Input gradient, rows independent: dx = s * (w*dy - x * s^2 * mean(w*dy*x)).
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < rows; ++i) {
    const float* x = inp + i * C;
    const float* dy = dout + i * C;
    const float s = rstd[i];
    double d = 0.0;
    for (int64_t c = 0; c < C; ++c) d += double(weight[c]) * double(dy[c]) * double(x[c]);
    const float k = float(d / double(C)) * s * s;
    float* dx = dinp + i * C;
    for (int64_t c = 0; c < C; ++c) dx[c] += (weight[c] * dy[c] - x[c] * k) * s;
  }
  // Weight gradient: columns split across threads (no races), rows summed in order, so the result
  // does not depend on the thread count.
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < C; c0 += 64) {
    const int64_t c1 = std::min(C, c0 + 64);
    double acc[64] = {};
    for (int64_t i = 0; i < rows; ++i) {
      const float* x = inp + i * C;
      const float* dy = dout + i * C;
      for (int64_t c = c0; c < c1; ++c) acc[c - c0] += double(x[c] * rstd[i]) * double(dy[c]);
    }
    for (int64_t c = c0; c < c1; ++c) dweight[c] += float(acc[c - c0]);
  }
}

}  // namespace trellis::ops
