#pragma once
// Vectorised exp and tanh for the CPU kernels (GCC/Clang vector extensions: 4 doubles = one AVX2
// register at -march=x86-64-v3). libm's expf/tanhf are scalar calls and dominated the GELU and
// softmax loops. Both functions evaluate in double: exp to a few 1e-16 relative, tanh to about
// 5e-16 / |tanh x| (1 - 2 / (e^2|x| + 1) cancels; at worst ~2e-12 just above |x| = 2^-12, where
// the series takes over). A float rounded from them is the nearest float except where the exact
// value lies within 5e-5 ulp of a tie, so within 0.5 + 5e-5 ulp: bench/simd_math_check (ctest
// kernels.simd_math_check) checks exactly that against libm's double functions (over all 2^32
// floats: exp always the nearest float, tanh 108 ties within 6.9e-6 ulp), at least as accurate
// as libm's float functions. Pure element-wise functions: results do not depend on vector width,
// thread count or position in the array.
#include <cstdint>
#include <cstring>

namespace trellis::simd {

using d4 = double __attribute__((vector_size(32)));
using l4 = int64_t __attribute__((vector_size(32)));
using f4 = float __attribute__((vector_size(16)));

inline d4 splat(double x) { return d4{x, x, x, x}; }

inline d4 load4(const float* p) {
  f4 v;
  std::memcpy(&v, p, sizeof v);
  return __builtin_convertvector(v, d4);
}
inline void store4(float* p, d4 x) {
  const f4 v = __builtin_convertvector(x, f4);
  std::memcpy(p, &v, sizeof v);
}
// The first n (< 4) lanes; the rest are `fill`.
inline d4 load_partial(const float* p, int64_t n, double fill = 0.0) {
  d4 v = splat(fill);
  for (int64_t i = 0; i < n; ++i) v[i] = double(p[i]);
  return v;
}
inline void store_partial(float* p, d4 x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) p[i] = float(x[i]);
}

inline d4 select(l4 mask, d4 a, d4 b) { return mask ? a : b; }
// Clamps that let NaN through (a NaN compares false).
inline d4 clamp_hi(d4 x, double hi) { return x > splat(hi) ? splat(hi) : x; }
inline d4 clamp_lo(d4 x, double lo) { return x < splat(lo) ? splat(lo) : x; }

// exp(x) in double. x <= -700 gives ~1e-304 (0 once rounded to float; exp(-inf) = 0),
// x > 709.78 gives +inf, NaN stays NaN. Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, then a
// degree-12 Taylor polynomial (truncation error < 2e-17 relative).
inline d4 exp(d4 x) {
  const d4 overflow = x > splat(709.782712893384) ? splat(__builtin_inf()) : splat(0.0);
  x = clamp_hi(clamp_lo(x, -700.0), 709.0);
  const d4 magic = splat(6755399441055744.0);  // 1.5 * 2^52: adding it rounds to integer
  const d4 kn = (x * splat(1.4426950408889634) + magic);
  const d4 n = kn - magic;
  const d4 r = (x - n * splat(6.93147180369123816490e-01)) - n * splat(1.90821492927058770002e-10);
  d4 p = splat(1.0 / 479001600.0);  // 1/12!
  p = p * r + splat(1.0 / 39916800.0);
  p = p * r + splat(1.0 / 3628800.0);
  p = p * r + splat(1.0 / 362880.0);
  p = p * r + splat(1.0 / 40320.0);
  p = p * r + splat(1.0 / 5040.0);
  p = p * r + splat(1.0 / 720.0);
  p = p * r + splat(1.0 / 120.0);
  p = p * r + splat(1.0 / 24.0);
  p = p * r + splat(1.0 / 6.0);
  p = p * r + splat(0.5);
  p = p * r + splat(1.0);
  p = p * r + splat(1.0);
  // 2^n: n sits in the low mantissa bits of kn; move it to the exponent field.
  l4 ni;
  std::memcpy(&ni, &kn, sizeof ni);
  const l4 mb =
      l4{0x4338000000000000LL, 0x4338000000000000LL, 0x4338000000000000LL, 0x4338000000000000LL};
  const l4 e = ((ni - mb) + 1023) << 52;
  d4 scale;
  std::memcpy(&scale, &e, sizeof scale);
  const d4 y = p * scale;
  return overflow > splat(0.0) ? overflow : y;
}

// tanh(x) in double: sign(x) * (1 - 2 / (exp(2|x|) + 1)), with tanh(x) = x (1 - x^2/3) below 2^-12
// (where the next term is < 1e-15 relative) and 1 above |x| = 20. NaN stays NaN.
inline d4 tanh(d4 x) {
  const d4 a = clamp_hi(x < splat(0.0) ? -x : x, 20.0);
  const d4 e = exp(a + a);
  const d4 big = splat(1.0) - splat(2.0) / (e + splat(1.0));
  const d4 small = x * (splat(1.0) - x * x * splat(1.0 / 3.0));  // keeps the sign of -0
  const d4 t = a < splat(0.000244140625) ? small : (x < splat(0.0) ? -big : big);
  return x != x ? x : t;
}

// 8 float lanes (one AVX2 register), for element-wise ops where float accuracy is enough and
// double lanes cost 4x: GELU.
using f8 = float __attribute__((vector_size(32)));
using i8 = int32_t __attribute__((vector_size(32)));

inline f8 splat8(float x) { return f8{x, x, x, x, x, x, x, x}; }
inline f8 load8(const float* p) {
  f8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store8(float* p, f8 x) { std::memcpy(p, &x, sizeof x); }
// The first n (< 8) lanes; the rest are 0.
inline f8 load8_partial(const float* p, int64_t n) {
  f8 v = {};
  for (int64_t i = 0; i < n; ++i) v[i] = p[i];
  return v;
}
inline void store8_partial(float* p, f8 x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) p[i] = x[i];
}

// exp(x) in float for x in [-80, 80] (callers clamp): Cody-Waite reduction x = n ln2 + r,
// |r| <= ln2/2, and Cephes' degree-6 minimax polynomial for expf; within 2 float ulps (checked by
// bench/simd_math_check).
inline f8 exp8_clamped(f8 x) {
  const f8 magic = splat8(12582912.0f);  // 1.5 * 2^23: adding it rounds to integer
  const f8 kn = x * splat8(1.44269504088896341f) + magic;
  const f8 n = kn - magic;
  const f8 r = (x - n * splat8(0.693359375f)) - n * splat8(-2.12194440e-4f);
  f8 p = splat8(1.9875691500e-4f);
  p = p * r + splat8(1.3981999507e-3f);
  p = p * r + splat8(8.3334519073e-3f);
  p = p * r + splat8(4.1665795894e-2f);
  p = p * r + splat8(1.6666665459e-1f);
  p = p * r + splat8(5.0000001201e-1f);
  p = p * r * r + r + splat8(1.0f);
  i8 ni;
  std::memcpy(&ni, &kn, sizeof ni);
  const i8 e = ((ni - 0x4b400000) + 127) << 23;  // n from kn's low mantissa bits, into 2^n
  f8 scale;
  std::memcpy(&scale, &e, sizeof scale);
  return p * scale;
}

}  // namespace trellis::simd
