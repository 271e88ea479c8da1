// Accuracy of trellis::simd::exp/tanh (src/trellis/kernels/cpu/simd_math.h) against libm's
// double functions, over every float bit pattern with a stride, plus special values. Prints the
// worst error in float ulps next to libm's own float functions. Exits 1 unless every exp/tanh
// result is libm's double value rounded to the nearest float, except where that value lies
// within kTie = 5e-5 ulp of halfway between two floats (then either of the two), so the error is
// at most 0.5 + 5e-5 ulp; or if the float-lane exp8_clamped (GELU's) exceeds 2 ulps on its
// domain [-80, 80].
//   simd_math_check [stride=97]     (stride 1: all 2^32 patterns, a few minutes)
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "trellis/kernels/cpu/simd_math.h"

namespace {
double ulps(float got, double want) {
  if (std::isnan(want)) return std::isnan(got) ? 0.0 : 1e9;
  if (std::isinf(want)) return got == float(want) ? 0.0 : 1e9;
  const float w = float(want);
  if (std::isinf(w)) return got == w ? 0.0 : 1e9;  // overflows in float
  const float up = std::nextafter(std::fabs(w), std::numeric_limits<float>::infinity());
  const double ulp = double(up) - double(std::fabs(w));
  return std::fabs(double(got) - want) / (ulp > 0 ? ulp : 1e-45);
}

// exp/tanh evaluate in double. exp is accurate to a few 1e-16 relative; tanh = 1 - 2 / (e^2|x| + 1)
// cancels just above |x| = 2^-12 (the series takes over below): an absolute error of ~5e-16 in
// 2 / (e + 1) becomes up to ~2.3e-12 relative, ~4e-5 float ulp. A float rounded from either is
// the correctly rounded one unless the exact value is that close to a tie, hence kTie = 5e-5.
// Measured over all 2^32 floats: exp 0 results off the nearest float, tanh 108, all within
// 6.9e-6 ulp of a tie.
constexpr double kTie = 5e-5;
constexpr float kInf = std::numeric_limits<float>::infinity();

// Whether got is want rounded to the nearest float, or want lies within kTie (in units of the
// gap between the two floats) of halfway between got and that nearest float, its neighbour; then
// *tie_dist keeps the largest such distance.
bool nearest_or_tie(float got, double want, double* tie_dist) {
  const float r = float(want);
  if (got == r || (std::isnan(got) && std::isnan(want))) return true;
  if (std::isinf(r) || std::isnan(got) ||
      (got != std::nextafter(r, -kInf) && got != std::nextafter(r, kInf)))
    return false;
  const double mid = (double(got) + double(r)) / 2, gap = std::fabs(double(got) - double(r));
  if (std::fabs(want - mid) > kTie * gap) return false;
  *tie_dist = std::max(*tie_dist, std::fabs(want - mid) / gap);
  return true;
}
}  // namespace

int main(int argc, char** argv) {
  const uint32_t stride = argc > 1 ? uint32_t(std::atoi(argv[1])) : 97;
  double worst_exp = 0, worst_tanh = 0, libm_exp = 0, libm_tanh = 0, worst_exp8 = 0;
  float at_exp = 0, at_tanh = 0, at_exp8 = 0;
  int64_t exp8_checked = 0;
  int64_t off_exp = 0, off_tanh = 0, ties_exp = 0, ties_tanh = 0;  // not nearest: beyond / at ties
  double tie_exp = 0, tie_tanh = 0;  // the farthest from halfway such a tie result was
  for (uint64_t bits = 0; bits < (1ull << 32); bits += stride) {
    float x;
    const uint32_t b = uint32_t(bits);
    std::memcpy(&x, &b, 4);
    if (std::isnan(x)) continue;
    const trellis::simd::d4 v = trellis::simd::splat(double(x));
    float e, t;
    trellis::simd::store_partial(&e, trellis::simd::exp(v), 1);
    trellis::simd::store_partial(&t, trellis::simd::tanh(v), 1);
    const double ue = ulps(e, std::exp(double(x))), ut = ulps(t, std::tanh(double(x)));
    if (ue > worst_exp) worst_exp = ue, at_exp = x;
    if (ut > worst_tanh) worst_tanh = ut, at_tanh = x;
    const double want_e = std::exp(double(x)), want_t = std::tanh(double(x));
    if (!nearest_or_tie(e, want_e, &tie_exp))
      ++off_exp;
    else if (e != float(want_e) && !std::isnan(e))
      ++ties_exp;
    if (!nearest_or_tie(t, want_t, &tie_tanh))
      ++off_tanh;
    else if (t != float(want_t) && !std::isnan(t))
      ++ties_tanh;
    libm_exp = std::max(libm_exp, ulps(std::exp(x), std::exp(double(x))));
    if (std::fabs(x) <= 80.0f) {
      const float e8 = trellis::simd::exp8_clamped(trellis::simd::splat8(x))[0];
      const double u8 = ulps(e8, std::exp(double(x)));
      if (u8 > worst_exp8) worst_exp8 = u8, at_exp8 = x;
      ++exp8_checked;
    }
    libm_tanh = std::max(libm_tanh, ulps(std::tanh(x), std::tanh(double(x))));
  }
  // Special values.
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  float out[4];
  trellis::simd::store_partial(out, trellis::simd::exp(trellis::simd::d4{inf, -inf, nan, 0.0}), 4);
  const bool exp_special =
      std::isinf(out[0]) && out[0] > 0 && out[1] == 0.0f && std::isnan(out[2]) && out[3] == 1.0f;
  trellis::simd::store_partial(out, trellis::simd::tanh(trellis::simd::d4{inf, -inf, nan, -0.0}),
                               4);
  const bool tanh_special = out[0] == 1.0f && out[1] == -1.0f && std::isnan(out[2]) &&
                            out[3] == 0.0f && std::signbit(out[3]);
  std::printf(
      "exp : worst %.7f ulp at %a (libm expf %.3f); off the nearest float: %lld at ties "
      "(farthest %.1e of the gap from halfway), %lld elsewhere; specials %s\n",
      worst_exp, at_exp, libm_exp, (long long)ties_exp, tie_exp, (long long)off_exp,
      exp_special ? "ok" : "WRONG");
  std::printf(
      "tanh: worst %.7f ulp at %a (libm tanhf %.3f); off the nearest float: %lld at ties "
      "(farthest %.1e of the gap from halfway), %lld elsewhere; specials %s\n",
      worst_tanh, at_tanh, libm_tanh, (long long)ties_tanh, tie_tanh, (long long)off_tanh,
      tanh_special ? "ok" : "WRONG");
  std::printf("exp8: worst %.3f ulp at %a over %lld values in [-80, 80]\n", worst_exp8, at_exp8,
              (long long)exp8_checked);
  return worst_exp <= 0.5 + kTie && worst_tanh <= 0.5 + kTie && off_exp == 0 && off_tanh == 0 &&
                 exp_special && tanh_special && worst_exp8 <= 2.0 && exp8_checked > 1000000
             ? 0
             : 1;
}
