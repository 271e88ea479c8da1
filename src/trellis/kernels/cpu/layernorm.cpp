// LayerNorm forward/backward (per row over C), statistics in float with a two-pass variance.
// The row sums run in 8 float lanes (a plain float loop is a serial chain the compiler may not
// reorder), combined in a fixed order: results do not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "trellis/kernels/ops.h"

namespace trellis::ops {

namespace {
using f8 = float __attribute__((vector_size(32)));

inline f8 load8(const float* p) {
  f8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline float lanes_sum(f8 v) {
  return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

// sum over c < C of term(c), with term8(c) the same for c .. c+7.
template <class Term8, class Term>
inline float row_sum(int64_t C, Term8 term8, Term term) {
  f8 acc = {};
  int64_t c = 0;
  for (; c + 8 <= C; c += 8) acc += term8(c);
  float s = lanes_sum(acc);
  for (; c < C; ++c) s += term(c);
  return s;
}
}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int64_t BT, int64_t C, float eps) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < BT; ++i) {
    const float* x = inp + i * C;
    const float m =
        row_sum(
            C, [&](int64_t c) { return load8(x + c); }, [&](int64_t c) { return x[c]; }) /
        float(C);
    const float v = row_sum(
                        C,
                        [&](int64_t c) {
                          const f8 d = load8(x + c) - m;
                          return d * d;
                        },
                        [&](int64_t c) { return (x[c] - m) * (x[c] - m); }) /
                    float(C);
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
    const float dnorm_mean = row_sum(
                                 C, [&](int64_t c) { return load8(weight + c) * load8(dy + c); },
                                 [&](int64_t c) { return weight[c] * dy[c]; }) /
                             float(C);
    const float dnorm_norm_mean =
        row_sum(
            C,
            [&](int64_t c) { return load8(weight + c) * load8(dy + c) * (load8(x + c) - m) * s; },
            [&](int64_t c) { return weight[c] * dy[c] * (x[c] - m) * s; }) /
        float(C);
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
