// Token + position embedding lookup and its scatter-add backward.
#include <algorithm>
#include "trellis/kernels/ops.h"

namespace trellis::ops {

void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                       int64_t B, int64_t T, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < B * T; ++i) {
    const float* e = wte + int64_t(tokens[i]) * C;
    const float* p = wpe + (i % T) * C;
    float* y = out + i * C;
    for (int64_t c = 0; c < C; ++c) y[c] = e[c] + p[c];
  }
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        int64_t B, int64_t T, int64_t C) {
  // Tokens repeat, so rows of dwte collide: split the channel dimension across threads instead.
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < C; c0 += 32) {
    const int64_t c1 = std::min(C, c0 + 32);
    for (int64_t i = 0; i < B * T; ++i) {
      float* e = dwte + int64_t(tokens[i]) * C;
      float* p = dwpe + (i % T) * C;
      const float* dy = dout + i * C;
      for (int64_t c = c0; c < c1; ++c) {
        e[c] += dy[c];
        p[c] += dy[c];
      }
    }
  }
}

}  // namespace trellis::ops
