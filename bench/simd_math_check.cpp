// Accuracy of trellis::simd::exp/tanh (src/trellis/kernels/cpu/simd_math.h) against libm's
// double functions, over every float bit pattern with a stride, plus special values. Prints the
// worst error in float ulps next to libm's own float functions; exits 1 if ours exceeds 1 ulp, or
// if the float-lane exp8_clamped (GELU's) exceeds 2 ulps on its domain [-80, 80].
//   simd_math_check [stride=97]
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
}  // namespace

int main(int argc, char** argv) {
  const uint32_t stride = argc > 1 ? uint32_t(std::atoi(argv[1])) : 97;
  double worst_exp = 0, worst_tanh = 0, libm_exp = 0, libm_tanh = 0, worst_exp8 = 0;
  float at_exp = 0, at_tanh = 0, at_exp8 = 0;
  int64_t exp8_checked = 0;
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
  std::printf("exp : worst %.3f ulp at %a (libm expf %.3f) specials %s\n", worst_exp, at_exp,
              libm_exp, exp_special ? "ok" : "WRONG");
  std::printf("tanh: worst %.3f ulp at %a (libm tanhf %.3f) specials %s\n", worst_tanh, at_tanh,
              libm_tanh, tanh_special ? "ok" : "WRONG");
  std::printf("exp8: worst %.3f ulp at %a over %lld values in [-80, 80]\n", worst_exp8, at_exp8,
              (long long)exp8_checked);
  return worst_exp <= 1.0 && worst_tanh <= 1.0 && exp_special && tanh_special &&
                 worst_exp8 <= 2.0 && exp8_checked > 1000000
             ? 0
             : 1;
}
