// Element-wise ops: GELU, SwiGLU, residual adds, scaling, norms.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "trellis/kernels/cpu/simd_math.h"
#include "trellis/kernels/ops.h"

namespace trellis::ops {

namespace {
constexpr double kSqrt2OverPi = 0.7978845608028654;
}

// Both GELU directions evaluate in double, 4 lanes at a time (simd_math.h): libm's scalar tanhf
// was a third of a small model's step. Element-wise, so the result does not depend on threads.
namespace {
inline simd::d4 gelu_u(simd::d4 x) {
  return simd::splat(kSqrt2OverPi) * (x + simd::splat(0.044715) * x * x * x);
}
inline simd::d4 gelu_fwd4(simd::d4 x) {
  return simd::splat(0.5) * x * (simd::splat(1.0) + simd::tanh(gelu_u(x)));
}
inline simd::d4 gelu_bwd4(simd::d4 x, simd::d4 dy) {
  const simd::d4 th = simd::tanh(gelu_u(x));
  const simd::d4 sech2 = simd::splat(1.0) - th * th;
  const simd::d4 du =
      simd::splat(kSqrt2OverPi) * (simd::splat(1.0) + simd::splat(3.0 * 0.044715) * x * x);
  return dy * (simd::splat(0.5) * (simd::splat(1.0) + th) + simd::splat(0.5) * x * sech2 * du);
}
constexpr int64_t kChunk = 2048;  // elements per OpenMP work item (a multiple of 4)
}  // namespace

void gelu_forward(float* out, const float* inp, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < n; c += kChunk) {
    const int64_t end = std::min(n, c + kChunk);
    int64_t i = c;
    for (; i + 4 <= end; i += 4) simd::store4(out + i, gelu_fwd4(simd::load4(inp + i)));
    if (i < end)
      simd::store_partial(out + i, gelu_fwd4(simd::load_partial(inp + i, end - i)), end - i);
  }
}

void gelu_bias_forward(float* out, float* inp, const float* bias, int64_t rows, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    float *x = inp + r * C, *y = out + r * C;
    int64_t c = 0;
    for (; c + 4 <= C; c += 4) {
      const simd::d4 v = simd::load4(x + c) + simd::load4(bias + c);
      simd::store4(x + c, v);
      simd::store4(y + c, gelu_fwd4(simd::load4(x + c)));
    }
    if (c < C) {
      const int64_t n = C - c;
      const simd::d4 v = simd::load_partial(x + c, n) + simd::load_partial(bias + c, n);
      simd::store_partial(x + c, v, n);
      simd::store_partial(y + c, gelu_fwd4(simd::load_partial(x + c, n)), n);
    }
  }
}

void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < n; c += kChunk) {
    const int64_t end = std::min(n, c + kChunk);
    int64_t i = c;
    for (; i + 4 <= end; i += 4)
      simd::store4(dinp + i,
                   simd::load4(dinp + i) + gelu_bwd4(simd::load4(inp + i), simd::load4(dout + i)));
    if (i < end) {
      const int64_t r = end - i;
      simd::store_partial(
          dinp + i,
          simd::load_partial(dinp + i, r) +
              gelu_bwd4(simd::load_partial(inp + i, r), simd::load_partial(dout + i, r)),
          r);
    }
  }
}

// SwiGLU in double, 4 lanes at a time, for the same reason as GELU; element-wise, so deterministic.
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
inline void store(float* p, simd::d4 x, int64_t n) {
  if (n == 4)
    simd::store4(p, x);
  else
    simd::store_partial(p, x, n);
}
}  // namespace

void swiglu_forward(float* out, const float* gu, int64_t rows, int64_t F) {
  swiglu_rows(rows, F, [&](int64_t r, int64_t j, int64_t n) {
    const float* g = gu + r * 2 * F + j;
    const simd::d4 g4 = load(g, n), u4 = load(g + F, n);
    store(out + r * F + j, g4 * sigmoid4(g4) * u4, n);
  });
}

void swiglu_backward(float* dgu, const float* gu, const float* dout, int64_t rows, int64_t F) {
  swiglu_rows(rows, F, [&](int64_t r, int64_t j, int64_t n) {
    const float* g = gu + r * 2 * F + j;
    float* dg = dgu + r * 2 * F + j;
    const simd::d4 g4 = load(g, n), u4 = load(g + F, n), dy = load(dout + r * F + j, n);
    const simd::d4 sg = sigmoid4(g4);
    // silu'(g) = sigmoid(g) * (1 + g * (1 - sigmoid(g))).
    const simd::d4 dsilu = sg * (simd::splat(1.0) + g4 * (simd::splat(1.0) - sg));
    store(dg, load(dg, n) + dy * u4 * dsilu, n);
    store(dg + F, load(dg + F, n) + dy * g4 * sg, n);
  });
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
