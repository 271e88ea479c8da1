// Element-wise ops: GELU, SwiGLU, residual adds, scaling, norms.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "trellis/kernels/cpu/bf16_lanes.h"
#include "trellis/kernels/cpu/simd_math.h"
#include "trellis/kernels/ops.h"

namespace trellis::ops {

// GELU (tanh form) in 8 float lanes: 0.5 x (1 + tanh(u)) = x * sigmoid(2u), u = sqrt(2/pi) (x +
// 0.044715 x^3), with exp clamped to [-80, 80] (beyond it sigmoid is 0 or 1 to float precision).
// A few float ulps from the exact function, 10x faster than the double lanes it replaced (GELU
// was a seventh of a small model's step). Element-wise: results do not depend on threads.
namespace {
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

inline simd::f8 clamp80(simd::f8 v) {
  v = v > simd::splat8(80.0f) ? simd::splat8(80.0f) : v;
  return v < simd::splat8(-80.0f) ? simd::splat8(-80.0f) : v;
}
// sigmoid(2u) for u = u(x).
inline simd::f8 gelu_gate(simd::f8 x) {
  const simd::f8 u = simd::splat8(kSqrt2OverPi) * (x + simd::splat8(kCubic) * x * x * x);
  return simd::splat8(1.0f) / (simd::splat8(1.0f) + simd::exp8_clamped(clamp80(-2.0f * u)));
}
inline simd::f8 gelu_fwd8(simd::f8 x) { return x * gelu_gate(x); }
// d/dx x*s(2u) = s + x * 2 s (1 - s) u', u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2).
inline simd::f8 gelu_bwd8(simd::f8 x, simd::f8 dy) {
  const simd::f8 s = gelu_gate(x);
  const simd::f8 du = simd::splat8(kSqrt2OverPi) * (simd::splat8(1.0f) + 3.0f * kCubic * x * x);
  return dy * (s + x * 2.0f * s * (simd::splat8(1.0f) - s) * du);
}
constexpr int64_t kChunk = 2048;  // elements per OpenMP work item (a multiple of 8)
}  // namespace

void gelu_forward(float* out, const float* inp, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < n; c += kChunk) {
    const int64_t end = std::min(n, c + kChunk);
    int64_t i = c;
    for (; i + 8 <= end; i += 8) simd::store8(out + i, gelu_fwd8(simd::load8(inp + i)));
    if (i < end)
      simd::store8_partial(out + i, gelu_fwd8(simd::load8_partial(inp + i, end - i)), end - i);
  }
}

namespace {
// up[r, :] = pre[r, :] (+ bias, when not null) stored as T, out = GELU of the stored value, so a
// bf16 kernel is the fp32 one on rounded values. (fp32: pre and up are the same rows.)
template <class T>
void gelu_bias_rows(T* out, T* up, const float* pre, const float* bias, int64_t rows, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = pre + r * C;
    T *u = up + r * C, *y = out + r * C;
    int64_t c = 0;
    for (; c + 8 <= C; c += 8) {
      simd::store8_rounded(u + c,
                           bias ? simd::load8(x + c) + simd::load8(bias + c) : simd::load8(x + c));
      simd::store8_rounded(y + c, gelu_fwd8(simd::load8_widened(u + c)));
    }
    if (c < C) {
      const int64_t n = C - c;
      const simd::f8 v = simd::load8_partial(x + c, n);
      simd::store8_rounded(u + c, bias ? v + simd::load8_partial(bias + c, n) : v, n);
      simd::store8_rounded(y + c, gelu_fwd8(simd::load8_widened(u + c, n)), n);
    }
  }
}

// dinp += GELU'(inp) dout, inp stored as T.
template <class T>
void gelu_backward_lanes(float* dinp, const T* inp, const float* dout, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < n; c += kChunk) {
    const int64_t end = std::min(n, c + kChunk);
    int64_t i = c;
    for (; i + 8 <= end; i += 8)
      simd::store8(dinp + i, simd::load8(dinp + i) +
                                 gelu_bwd8(simd::load8_widened(inp + i), simd::load8(dout + i)));
    if (i < end) {
      const int64_t r = end - i;
      simd::store8_partial(
          dinp + i,
          simd::load8_partial(dinp + i, r) +
              gelu_bwd8(simd::load8_widened(inp + i, r), simd::load8_partial(dout + i, r)),
          r);
    }
  }
}
}  // namespace

void gelu_bias_forward(float* out, float* inp, const float* bias, int64_t rows, int64_t C) {
  gelu_bias_rows(out, inp, inp, bias, rows, C);
}

void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
  gelu_backward_lanes(dinp, inp, dout, n);
}

void gelu_forward_bf16(uint16_t* out, uint16_t* up, const float* pre, const float* bias,
                       int64_t rows, int64_t C) {
  gelu_bias_rows(out, up, pre, bias, rows, C);
}

void gelu_backward_bf16(float* dinp, const uint16_t* inp, const float* dout, int64_t n) {
  gelu_backward_lanes(dinp, inp, dout, n);
}

// SwiGLU in double, 4 lanes at a time, for the same reason as GELU; element-wise, so deterministic.
// A bf16 model's gate | up is kept in bf16: widened on load, the output rounded once on store.
namespace {
inline simd::d4 sigmoid4(simd::d4 g) {
  return simd::splat(1.0) / (simd::splat(1.0) + simd::exp(-g));
}
// Calls f(r, j, n) over columns [j, j + n) of each row r: groups of n = 4, then the tail (n < 4).
template <class Fn>
void swiglu_rows(int64_t rows, int64_t F, Fn f) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    int64_t j = 0;
    for (; j + 4 <= F; j += 4) f(r, j, int64_t(4));
    if (j < F) f(r, j, F - j);
  }
}
inline simd::d4 load(const float* p, int64_t n) {
  return n == 4 ? simd::load4(p) : simd::load_partial(p, n);
}
inline simd::d4 load(const uint16_t* p, int64_t n) {
  float v[4];
  for (int64_t i = 0; i < n; ++i) v[i] = simd::widen_bf16(p[i]);
  return load(v, n);
}
inline void store(float* p, simd::d4 x, int64_t n) {
  if (n == 4)
    simd::store4(p, x);
  else
    simd::store_partial(p, x, n);
}
inline void store(uint16_t* p, simd::d4 x, int64_t n) {
  float y[4];
  store(y, x, n);
  for (int64_t i = 0; i < n; ++i) p[i] = simd::round_bf16(y[i]);
}

// out = silu(gate) * up over gu stored as T; before(r, j, n) runs first on each group (bf16:
// rounds the group's gate and up into gu).
template <class T, class Before>
void swiglu_forward_lanes(T* out, const T* gu, int64_t rows, int64_t F, Before before) {
  swiglu_rows(rows, F, [&](int64_t r, int64_t j, int64_t n) {
    before(r, j, n);
    const T* g = gu + r * 2 * F + j;
    const simd::d4 g4 = load(g, n), u4 = load(g + F, n);
    store(out + r * F + j, g4 * sigmoid4(g4) * u4, n);
  });
}

template <class T>
void swiglu_backward_lanes(float* dgu, const T* gu, const float* dout, int64_t rows, int64_t F) {
  swiglu_rows(rows, F, [&](int64_t r, int64_t j, int64_t n) {
    const T* g = gu + r * 2 * F + j;
    float* dg = dgu + r * 2 * F + j;
    const simd::d4 g4 = load(g, n), u4 = load(g + F, n), dy = load(dout + r * F + j, n);
    const simd::d4 sg = sigmoid4(g4);
    // silu'(g) = sigmoid(g) * (1 + g * (1 - sigmoid(g))).
    const simd::d4 dsilu = sg * (simd::splat(1.0) + g4 * (simd::splat(1.0) - sg));
    store(dg, load(dg, n) + dy * u4 * dsilu, n);
    store(dg + F, load(dg + F, n) + dy * g4 * sg, n);
  });
}
}  // namespace

void swiglu_forward(float* out, const float* gu, int64_t rows, int64_t F) {
  swiglu_forward_lanes(out, gu, rows, F, [](int64_t, int64_t, int64_t) {});
}

void swiglu_backward(float* dgu, const float* gu, const float* dout, int64_t rows, int64_t F) {
  swiglu_backward_lanes(dgu, gu, dout, rows, F);
}

// bf16: gate and up rounded from the GEMM's output into gu, then the fp32 kernel's double lanes
// on the rounded values, its output rounded once.
void swiglu_forward_bf16(uint16_t* out, uint16_t* gu, const float* pre, int64_t rows, int64_t F) {
  swiglu_forward_lanes(out, gu, rows, F, [&](int64_t r, int64_t j, int64_t n) {
    const float* g = pre + r * 2 * F + j;
    uint16_t* gr = gu + r * 2 * F + j;
    for (int64_t i = 0; i < n; ++i)
      gr[i] = simd::round_bf16(g[i]), gr[F + i] = simd::round_bf16(g[F + i]);
  });
}

void swiglu_backward_bf16(float* dgu, const uint16_t* gu, const float* dout, int64_t rows,
                          int64_t F) {
  swiglu_backward_lanes(dgu, gu, dout, rows, F);
}

void accumulate(float* y, const float* x, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void zero(float* x, int64_t n) {
  constexpr int64_t kChunk = 1 << 16;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < n; c += kChunk)
    std::memset(x + c, 0, size_t(std::min(kChunk, n - c)) * sizeof(float));
}

void scale(float* x, float s, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

double sum_squares(const float* x, int64_t n) {
  // Fixed blocks summed in order: the result does not depend on the thread count or timing
  // (an OpenMP reduction combines partial sums in arrival order), so runs are bit-reproducible.
  constexpr int64_t kBlock = 8192;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(size_t(blocks), 0.0);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    // Sixteen independent accumulators (a fixed lane pattern, so still reproducible): a single
    // running sum is bound by the add latency, not by memory.
    simd::d4 acc[4] = {};
    const int64_t begin = b * kBlock, end = std::min(n, begin + kBlock);
    int64_t i = begin;
    for (; i + 16 <= end; i += 16)
      for (int k = 0; k < 4; ++k) {
        const simd::d4 v = simd::load4(x + i + 4 * k);
        acc[k] += v * v;
      }
    for (; i + 4 <= end; i += 4) {
      const simd::d4 v = simd::load4(x + i);
      acc[0] += v * v;
    }
    if (i < end) {
      const simd::d4 v = simd::load_partial(x + i, end - i);
      acc[0] += v * v;
    }
    const simd::d4 s4 = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    partial[size_t(b)] = (s4[0] + s4[1]) + (s4[2] + s4[3]);
  }
  double total = 0.0;
  for (double s : partial) total += s;
  return total;
}

}  // namespace trellis::ops
