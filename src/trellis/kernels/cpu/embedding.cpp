// Token lookup over a vocabulary slice, position embedding (from fp32 or bf16 tables), and their
// scatter-add backwards.
#include <algorithm>
#include <cstring>

#include "trellis/core/bf16.h"
#include "trellis/core/error.h"
#include "trellis/kernels/ops.h"

namespace trellis::ops {

namespace {
// A table element as the lookups read it: fp32, or bf16 bits widened (exact).
float value(float w) { return w; }
float value(uint16_t w) { return widen_bf16(w); }

template <class W>
void lookup(float* out, const int32_t* tokens, const W* wte, int64_t vocab_start,
            int64_t vocab_rows, int64_t n, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = int64_t(tokens[i]) - vocab_start;
    float* y = out + i * C;
    if (row >= 0 && row < vocab_rows)
      for (int64_t c = 0; c < C; ++c) y[c] = value(wte[row * C + c]);
    else
      std::memset(y, 0, size_t(C) * sizeof(float));
  }
}

template <class W>
void add_positions(float* out, const W* wpe, int64_t row0, int64_t rows, int64_t T, int64_t C,
                   const int32_t* pos) {
  for (int64_t i = 0; pos && i < rows; ++i)
    TRELLIS_CHECK(pos[row0 + i] >= 0 && pos[row0 + i] < T, "position {} of row {} outside [0, {})",
                  pos[row0 + i], row0 + i, T);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < rows; ++i) {
    const W* p = wpe + (pos ? pos[row0 + i] : (row0 + i) % T) * C;
    float* y = out + i * C;
    for (int64_t c = 0; c < C; ++c) y[c] += value(p[c]);
  }
}
}  // namespace

void embedding_forward(float* out, const int32_t* tokens, const float* wte, int64_t vocab_start,
                       int64_t vocab_rows, int64_t n, int64_t C) {
  lookup(out, tokens, wte, vocab_start, vocab_rows, n, C);
}

void embedding_forward_bf16(float* out, const int32_t* tokens, const uint16_t* wte,
                            int64_t vocab_start, int64_t vocab_rows, int64_t n, int64_t C) {
  lookup(out, tokens, wte, vocab_start, vocab_rows, n, C);
}

void embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int64_t vocab_start,
                        int64_t vocab_rows, int64_t n, int64_t C) {
  // Tokens repeat, so rows of dwte collide: split the channel dimension across threads instead.
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < C; c0 += 32) {
    const int64_t c1 = std::min(C, c0 + 32);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t row = int64_t(tokens[i]) - vocab_start;
      if (row < 0 || row >= vocab_rows) continue;
      float* e = dwte + row * C;
      const float* dy = dout + i * C;
      for (int64_t c = c0; c < c1; ++c) e[c] += dy[c];
    }
  }
}

void position_forward(float* out, const float* wpe, int64_t row0, int64_t rows, int64_t T,
                      int64_t C, const int32_t* pos) {
  add_positions(out, wpe, row0, rows, T, C, pos);
}

void position_forward_bf16(float* out, const uint16_t* wpe, int64_t row0, int64_t rows, int64_t T,
                           int64_t C, const int32_t* pos) {
  add_positions(out, wpe, row0, rows, T, C, pos);
}

void position_backward(float* dwpe, const float* dout, int64_t row0, int64_t rows, int64_t T,
                       int64_t C, const int32_t* pos) {
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < C; c0 += 32) {
    const int64_t c1 = std::min(C, c0 + 32);
    for (int64_t i = 0; i < rows; ++i) {
      float* p = dwpe + (pos ? pos[row0 + i] : (row0 + i) % T) * C;
      const float* dy = dout + i * C;
      for (int64_t c = c0; c < c1; ++c) p[c] += dy[c];
    }
  }
}

}  // namespace trellis::ops
