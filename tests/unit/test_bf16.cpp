// bf16 kernels: the fp32 -> bf16 rounding against an independent nearest-even rule evaluated in
// double, and the mixed-precision GEMM against a double reference on the rounded operands.
#include <gtest/gtest.h>
#include <omp.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "trellis/kernels/ops.h"

namespace {

namespace ops = trellis::ops;

double bf16_value(uint32_t hi16) {  // bf16 bits (as the top half of a float) -> value
  if ((hi16 & 0x7f80u) == 0x7f80u && (hi16 & 0x7fu) == 0)  // infinity: 2^128 for distances
    return (hi16 & 0x8000u ? -1.0 : 1.0) * std::ldexp(1.0, 128);
  return double(std::bit_cast<float>(hi16 << 16));
}

// Independent rule: of the two bf16 neighbours of x (truncation and one ulp further from zero),
// the nearer one in exact (double) arithmetic; on a tie the one with an even last bit.
uint16_t nearest_even_reference(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const uint32_t lo = u >> 16, hi = lo + 1;
  const double dlo = std::abs(double(x) - bf16_value(lo)), dhi = std::abs(bf16_value(hi) - x);
  if (dlo < dhi) return uint16_t(lo);
  if (dhi < dlo) return uint16_t(hi);
  return uint16_t(lo % 2 == 0 ? lo : hi);
}

TEST(Bf16, RoundsToNearestEvenLikeTheExactRule) {
  std::vector<float> xs = {0.0f,
                           -0.0f,
                           1.0f,
                           -1.0f,
                           FLT_MIN,
                           -FLT_MIN,
                           FLT_TRUE_MIN,
                           std::numeric_limits<float>::denorm_min() * 3,
                           65504.0f,
                           1e-30f,
                           std::bit_cast<float>(0x3f808000u),  // tie, even below: stays 0x3f80
                           std::bit_cast<float>(0x3f818000u),  // tie, odd below: up to 0x3f82
                           std::bit_cast<float>(0x3f808001u),  // just above a tie: up
                           std::bit_cast<float>(0x3f807fffu),  // just below a tie: down
                           std::bit_cast<float>(0x007f8000u),  // subnormal tie
                           std::bit_cast<float>(0x7f7f0000u),
                           std::bit_cast<float>(0x7f7f7fffu)};
  std::mt19937 rng(3);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    const float x = std::bit_cast<float>(bits(rng));
    if (std::isfinite(x)) xs.push_back(x);
  }
  std::vector<uint16_t> got(xs.size());
  ops::to_bf16(got.data(), xs.data(), int64_t(xs.size()));
  int checked = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    ASSERT_EQ(got[i], nearest_even_reference(xs[i]))
        << "x = " << xs[i] << " (bits 0x" << std::hex << std::bit_cast<uint32_t>(xs[i]) << ")";
    ++checked;
  }
  EXPECT_GT(checked, 190000);  // the random bit patterns that are finite
  // Values beyond the largest bf16 by half an ulp or more overflow to infinity.
  EXPECT_EQ(got[15], 0x7f7fu);
  EXPECT_EQ(got[16], 0x7f7fu);
  uint16_t big;
  const float fmax = FLT_MAX;
  ops::to_bf16(&big, &fmax, 1);
  EXPECT_EQ(big, 0x7f80u);
}

TEST(Bf16, SpecialValuesAndRoundTrip) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> xs = {inf, -inf, std::numeric_limits<float>::quiet_NaN(),
                                 std::bit_cast<float>(0x7f800001u)};  // signalling NaN
  std::vector<uint16_t> b(xs.size());
  ops::to_bf16(b.data(), xs.data(), int64_t(xs.size()));
  EXPECT_EQ(b[0], 0x7f80u);
  EXPECT_EQ(b[1], 0xff80u);
  std::vector<float> back(xs.size());
  ops::from_bf16(back.data(), b.data(), int64_t(b.size()));
  EXPECT_EQ(back[0], inf);
  EXPECT_EQ(back[1], -inf);
  EXPECT_TRUE(std::isnan(back[2]));
  EXPECT_TRUE(std::isnan(back[3]));  // the payload would have been lost: must stay a NaN
  // Every bf16 value converts back exactly and rounds to itself.
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = uint16_t(i);
  std::vector<float> f(all.size());
  ops::from_bf16(f.data(), all.data(), int64_t(all.size()));
  std::vector<uint16_t> again(all.size());
  ops::to_bf16(again.data(), f.data(), int64_t(f.size()));
  for (uint32_t i = 0; i < 65536; ++i)
    if (!std::isnan(f[i])) ASSERT_EQ(again[i], all[i]) << "bf16 0x" << std::hex << i;
}

float round_trip(float x) {
  uint16_t b;
  ops::to_bf16(&b, &x, 1);
  float y;
  ops::from_bf16(&y, &b, 1);
  return y;
}

// C = alpha * op(A) op(B) + beta * C with A, B rounded to bf16 and summed in double: the bf16 GEMM
// may differ only by its fp32 accumulation, bounded by gamma_K * sum|terms| as for sgemm.
void check_gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, float beta,
                     uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "ta=" << ta << " tb=" << tb << " M=" << M << " N=" << N
                                  << " K=" << K << " alpha=" << alpha << " beta=" << beta);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  const int64_t arows = ta ? K : M, acols = ta ? M : K, brows = tb ? N : K, bcols = tb ? K : N;
  const int64_t lda = acols + 3, ldb = bcols + 1, ldc = N + 2;
  std::vector<float> A(size_t(arows * lda)), B(size_t(brows * ldb)), C(size_t(M * ldc));
  for (float& v : A) v = nd(rng);
  for (float& v : B) v = nd(rng);
  for (float& v : C) v = nd(rng);
  std::vector<float> Ar(A.size()), Br(B.size());  // the operands as bf16 values
  for (size_t i = 0; i < A.size(); ++i) Ar[i] = round_trip(A[i]);
  for (size_t i = 0; i < B.size(); ++i) Br[i] = round_trip(B[i]);
  auto at = [&](int64_t i, int64_t k) { return ta ? size_t(k * lda + i) : size_t(i * lda + k); };
  auto bt = [&](int64_t k, int64_t j) { return tb ? size_t(j * ldb + k) : size_t(k * ldb + j); };
  std::vector<float> got = C;
  ops::gemm_bf16(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, got.data(), ldc);
  const double gamma = 2.0 * double(K + 2) * (FLT_EPSILON / 2);
  double max_unrounded_diff = 0.0;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double exact = 0.0, bound = 0.0, unrounded = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const double p = double(Ar[at(i, k)]) * double(Br[bt(k, j)]);
        exact += p;
        bound += std::abs(p);
        unrounded += double(A[at(i, k)]) * double(B[bt(k, j)]);
      }
      const double c0 = beta == 0.0f ? 0.0 : double(beta) * C[size_t(i * ldc + j)];
      const double want = double(alpha) * exact + c0;
      const double tol = gamma * (std::abs(alpha) * bound + std::abs(c0)) + 1e-30;
      ASSERT_LE(std::abs(got[size_t(i * ldc + j)] - want), tol) << "at (" << i << "," << j << ")";
      max_unrounded_diff = std::max(max_unrounded_diff,
                                    std::abs(double(alpha) * unrounded + c0 - want) / (1 + bound));
    }
  // The operands really were rounded: bf16 keeps 8 bits, so the product moves by ~1e-3.
  EXPECT_GT(max_unrounded_diff, 1e-4);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = N; j < ldc; ++j)
      EXPECT_EQ(got[size_t(i * ldc + j)], C[size_t(i * ldc + j)]) << "wrote into ldc padding";
}

TEST(Bf16, GemmAllTransposesAlphaBetaStrides) {
  uint32_t seed = 10;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      check_gemm_bf16(ta, tb, 5, 7, 6, 1.0f, 0.0f, seed++);
      check_gemm_bf16(ta, tb, 5, 7, 6, 0.75f, 1.0f, seed++);
      check_gemm_bf16(ta, tb, 9, 4, 33, -1.5f, 0.5f, seed++);
    }
}

TEST(Bf16, GemmSplitAcrossThreadsEqualsOneThread) {
  // Large enough to be split into one block of C per thread, along N and along M.
  for (auto [M, N] : {std::pair<int64_t, int64_t>{48, 200}, {200, 48}}) {
    const int64_t K = 300;
    std::mt19937 rng(static_cast<uint32_t>(M));
    std::normal_distribution<float> nd;
    std::vector<float> A(size_t(M * K)), B(size_t(K * N));
    for (float& v : A) v = nd(rng);
    for (float& v : B) v = nd(rng);
    std::vector<float> one(size_t(M * N), 0.0f), two(one.size(), 0.0f);
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    ops::gemm_bf16(false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, one.data(), N);
    omp_set_num_threads(2);
    ops::gemm_bf16(false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, two.data(), N);
    omp_set_num_threads(saved);
    EXPECT_EQ(one, two) << "M=" << M << " N=" << N;
    check_gemm_bf16(false, false, M, N, K, 1.0f, 1.0f, 99);
    check_gemm_bf16(true, true, M, N, K, 0.5f, 0.0f, 98);
  }
}

TEST(Bf16, GemmFromInsideAnOpenMPRegion) {
  const int64_t M = 6, N = 5, K = 7, n = 8;
  std::mt19937 rng(8);
  std::normal_distribution<float> nd;
  std::vector<float> A(size_t(n * M * K)), B(size_t(n * K * N));
  for (float& v : A) v = nd(rng);
  for (float& v : B) v = nd(rng);
  std::vector<float> serial(size_t(n * M * N), 0.0f), parallel(serial.size(), 0.0f);
  for (int64_t r = 0; r < n; ++r)
    ops::gemm_bf16(false, false, M, N, K, 1.0f, A.data() + r * M * K, K, B.data() + r * K * N, N,
                   0.0f, serial.data() + r * M * N, N);
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t r = 0; r < n; ++r)
    ops::gemm_bf16(false, false, M, N, K, 1.0f, A.data() + r * M * K, K, B.data() + r * K * N, N,
                   0.0f, parallel.data() + r * M * N, N);
  EXPECT_EQ(serial, parallel);
}

}  // namespace

// Operands rounded once (packed, or a strided slice of a wider bf16 matrix) give the bits of
// rounding at the call, for every transpose, with fp32 and bf16 operands mixed.
TEST(Bf16, OperandsRoundedOnceEqualRoundingAtTheCall) {
  std::mt19937 rng(21);
  std::normal_distribution<float> nd;
  const int64_t M = 37, N = 29, K = 45;
  int compared = 0;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (int64_t pad : {0, 5}) {  // 5: the operands are column slices of wider matrices
        const int64_t arows = ta ? K : M, acols = ta ? M : K, brows = tb ? N : K,
                      bcols = tb ? K : N;
        const int64_t lda = acols + pad, ldb = bcols + pad;
        std::vector<float> A(size_t(arows * lda)), B(size_t(brows * ldb));
        for (float& v : A) v = nd(rng);
        for (float& v : B) v = nd(rng);
        std::vector<uint16_t> A16(A.size()), B16(B.size());
        ops::to_bf16(A16.data(), A.data(), int64_t(A.size()));
        ops::to_bf16(B16.data(), B.data(), int64_t(B.size()));
        std::vector<float> want(size_t(M * N), 0.5f);
        ops::gemm_bf16(ta, tb, M, N, K, 1.0f, A.data(), lda, B.data(), ldb, 1.0f, want.data(), N);
        const ops::GemmOperand a32{A.data(), nullptr, lda}, a16{nullptr, A16.data(), lda};
        const ops::GemmOperand b32{B.data(), nullptr, ldb}, b16{nullptr, B16.data(), ldb};
        for (auto [a, b] : {std::pair{a16, b16}, {a16, b32}, {a32, b16}}) {
          std::vector<float> got(size_t(M * N), 0.5f);
          ops::gemm_bf16_operands(ta, tb, M, N, K, 1.0f, a, b, 1.0f, got.data(), N);
          ASSERT_EQ(got, want) << "ta=" << ta << " tb=" << tb << " pad=" << pad;
          ++compared;
        }
      }
  EXPECT_EQ(compared, 24);
  // The fp32 GEMM takes fp32 operands only.
  std::vector<float> x(4, 1.0f), c(4);
  std::vector<uint16_t> x16(4);
  EXPECT_ANY_THROW(ops::gemm_operands(false, false, 2, 2, 2, 1.0f, {nullptr, x16.data(), 2},
                                      {x.data(), nullptr, 2}, 0.0f, c.data(), 2));
}

// The MLP activations over bf16 storage are the fp32 kernels (tested against double references
// and finite differences in test_kernels) on the rounded values, bit for bit: up = to_bf16(pre
// (+ bias)), out = to_bf16(fp32 kernel(up)), and the backwards the fp32 ones on the widened up.
// Shapes with per-row SIMD tails; pre includes NaN-free extremes (silu/GELU saturation).
namespace {
std::vector<float> widened(const std::vector<uint16_t>& b) {
  std::vector<float> f(b.size());
  ops::from_bf16(f.data(), b.data(), int64_t(b.size()));
  return f;
}
std::vector<uint16_t> rounded(const std::vector<float>& f) {
  std::vector<uint16_t> b(f.size());
  ops::to_bf16(b.data(), f.data(), int64_t(f.size()));
  return b;
}
std::vector<float> normal(std::mt19937& rng, size_t n, float scale) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  if (n >= 3) v[0] = 30.0f, v[1] = -30.0f, v[2] = 0.0f;
  return v;
}
struct Shape {
  int64_t rows, width;
};
const Shape kActivationShapes[] = {{5, 19}, {1, 1}, {3, 16}, {7, 33}, {2, 67}};
}  // namespace

TEST(Bf16, GeluOverBf16StorageIsTheFp32KernelOnRoundedValues) {
  std::mt19937 rng(71);
  int compared = 0;
  for (const Shape& s : kActivationShapes)
    for (bool with_bias : {true, false}) {
      const size_t n = size_t(s.rows * s.width);
      const std::vector<float> pre = normal(rng, n, 2.0f), bias = normal(rng, size_t(s.width), 1.0f);
      std::vector<uint16_t> up(n), out(n);
      ops::gelu_forward_bf16(out.data(), up.data(), pre.data(), with_bias ? bias.data() : nullptr,
                             s.rows, s.width);
      std::vector<float> sum = pre;
      if (with_bias)
        for (size_t i = 0; i < n; ++i) sum[i] += bias[i % size_t(s.width)];
      const std::vector<uint16_t> want_up = rounded(sum);
      std::vector<float> act(n);
      ops::gelu_forward(act.data(), widened(want_up).data(), int64_t(n));
      EXPECT_EQ(up, want_up) << s.rows << "x" << s.width;
      EXPECT_EQ(out, rounded(act)) << s.rows << "x" << s.width;
      // backward accumulates into what is there
      const std::vector<float> dout = normal(rng, n, 1.0f), start = normal(rng, n, 1.0f);
      std::vector<float> got = start, want = start;
      ops::gelu_backward_bf16(got.data(), up.data(), dout.data(), int64_t(n));
      ops::gelu_backward(want.data(), widened(up).data(), dout.data(), int64_t(n));
      EXPECT_EQ(got, want) << s.rows << "x" << s.width;
      EXPECT_NE(got, start);
      ++compared;
    }
  EXPECT_EQ(compared, 10);
}

TEST(Bf16, SwiGluOverBf16StorageIsTheFp32KernelOnRoundedValues) {
  std::mt19937 rng(72);
  int compared = 0;
  for (const Shape& s : kActivationShapes) {
    const int64_t F = s.width;
    const size_t n = size_t(s.rows * F);
    const std::vector<float> pre = normal(rng, 2 * n, 2.0f);
    std::vector<uint16_t> gu(2 * n), out(n);
    ops::swiglu_forward_bf16(out.data(), gu.data(), pre.data(), s.rows, F);
    const std::vector<uint16_t> want_gu = rounded(pre);
    std::vector<float> act(n);
    ops::swiglu_forward(act.data(), widened(want_gu).data(), s.rows, F);
    EXPECT_EQ(gu, want_gu) << s.rows << "x" << F;
    EXPECT_EQ(out, rounded(act)) << s.rows << "x" << F;
    const std::vector<float> dout = normal(rng, n, 1.0f), start = normal(rng, 2 * n, 1.0f);
    std::vector<float> got = start, want = start;
    ops::swiglu_backward_bf16(got.data(), gu.data(), dout.data(), s.rows, F);
    ops::swiglu_backward(want.data(), widened(gu).data(), dout.data(), s.rows, F);
    EXPECT_EQ(got, want) << s.rows << "x" << F;
    EXPECT_NE(got, start);
    ++compared;
  }
  EXPECT_EQ(compared, 5);
}

// Attention over bf16 q|k|v is the fp32 tiled kernel on the widened values, bit for bit: forward
// (out, lse) and backward (accumulated dq, dk, dv), with q|k|v fused in one row (stride > width),
// grouped-query heads, a causal and a padded bidirectional shape, and key blocks small enough to
// cross several block edges.
TEST(Bf16, AttentionOverBf16QkvIsTheFp32KernelOnRoundedValues) {
  std::mt19937 rng(73);
  int compared = 0;
  for (bool causal : {true, false}) {
    const int64_t B = 2, T = 13, H = 4, Hkv = 2, hd = 8, Q = H * hd, KV = Hkv * hd, W = Q + 2 * KV;
    const std::vector<int32_t> lengths = {13, 9};
    ops::AttentionShape s{B, T, T, H, Hkv, hd, causal, causal ? nullptr : lengths.data()};
    s.tiles = {4, 5};
    s.query_len = s.key_len;
    const std::vector<uint16_t> qkv = rounded(normal(rng, size_t(B * T * W), 1.0f));
    const std::vector<float> wide = widened(qkv);
    std::vector<float> out16(size_t(B * T * Q)), lse16(size_t(B * H * T));
    std::vector<float> out32 = out16, lse32 = lse16;
    ops::attention_forward_bf16(out16.data(), lse16.data(), qkv.data(), W, qkv.data() + Q,
                                qkv.data() + Q + KV, W, s);
    ops::attention_forward(out32.data(), lse32.data(), wide.data(), W, wide.data() + Q,
                           wide.data() + Q + KV, W, s);
    EXPECT_EQ(out16, out32);
    EXPECT_EQ(lse16, lse32);
    const std::vector<float> dout = normal(rng, out32.size(), 1.0f), start = normal(rng, wide.size(), 1.0f);
    std::vector<float> d16 = start, d32 = start;
    ops::attention_backward_bf16(d16.data(), d16.data() + Q, d16.data() + Q + KV, dout.data(),
                                 qkv.data(), W, qkv.data() + Q, qkv.data() + Q + KV, W,
                                 out16.data(), lse16.data(), s);
    ops::attention_backward(d32.data(), d32.data() + Q, d32.data() + Q + KV, dout.data(),
                            wide.data(), W, wide.data() + Q, wide.data() + Q + KV, W, out32.data(),
                            lse32.data(), s);
    EXPECT_EQ(d16, d32);
    EXPECT_NE(d16, start);
    ++compared;
  }
  EXPECT_EQ(compared, 2);
}
