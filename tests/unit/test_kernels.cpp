// kernels/: every op in trellis/kernels/ops.h against plain-loop double-precision references,
// table-driven in the style of ggml's test-backend-ops. Each op is one OpCase (kernel_case.h):
// seeded inputs, the trellis call, a double reference and, where the op has one, its backward.
// run_case() runs it on guarded buffers (canaries before and after every input, output and
// gradient; inputs must come back bit for bit), compares the forward normwise (kFwdTol) and, in
// gradient mode, the accumulated gradients against central differences of the double reference
// (kGradTol). Each op has a table of shapes: the small ones (B=2, T=5, C=8, H=2, V=11, Vp=16),
// ones that cross the kernels' column-chunk boundaries (32 / 64), and odd sizes (1, primes,
// non-multiples of the SIMD width), so an overrun in a tail shows in a guard. What a table
// cannot say (thread counts, masks' exact zeros, vocabulary splits, bad shapes) is in property
// tests after each op's table. TRELLIS_KERNEL_SPEED=1 prints timings (never asserted).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <barrier>
#include <cfloat>
#include <cmath>
#include <complex>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <numbers>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernel_case.h"
#include "trellis/core/bf16.h"
#include "trellis/core/error.h"
#include "trellis/kernels/isa.h"
#include "trellis/kernels/ops.h"

namespace {

using namespace kernel_case;  // NOLINT: the harness's vocabulary (Vec, OpCase, run_case, ...)
namespace ops = trellis::ops;

constexpr int64_t kB = 2, kT = 5, kC = 8, kH = 2, kV = 11, kVp = 16;

std::string shape_name(const std::string& op, std::initializer_list<std::pair<const char*, int64_t>> dims) {
  std::string s = op;
  for (const auto& [k, v] : dims) s += " " + std::string(k) + "=" + std::to_string(v);
  return s;
}

// ---------------------------------------------------------------------------------------------
// Double-precision references (plain loops).

void gemm_ref(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const Vec& A,
              int64_t lda, const Vec& B, int64_t ldb, double beta, DVec& C, int64_t ldc,
              DVec* bound) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0.0, sa = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const double a = ta ? A[k * lda + i] : A[i * lda + k];
        const double b = tb ? B[j * ldb + k] : B[k * ldb + j];
        s += a * b;
        sa += std::abs(a * b);
      }
      const double c = C[i * ldc + j];
      C[i * ldc + j] = alpha * s + beta * c;
      if (bound) (*bound)[i * ldc + j] = std::abs(alpha) * sa + std::abs(beta * c);
    }
}

DVec linear_ref(const DVec& inp, const DVec& w, const DVec* bias, int64_t BT, int64_t IC,
                int64_t OC) {
  DVec out(sz(BT * OC));
  for (int64_t i = 0; i < BT; ++i)
    for (int64_t o = 0; o < OC; ++o) {
      double s = bias ? (*bias)[o] : 0.0;
      for (int64_t c = 0; c < IC; ++c) s += inp[i * IC + c] * w[c * OC + o];
      out[i * OC + o] = s;
    }
  return out;
}

DVec layernorm_ref(const DVec& x, const DVec& w, const DVec& b, int64_t BT, int64_t C, double eps,
                   DVec* mean = nullptr, DVec* rstd = nullptr) {
  DVec out(sz(BT * C));
  for (int64_t i = 0; i < BT; ++i) {
    double m = 0.0;
    for (int64_t c = 0; c < C; ++c) m += x[i * C + c];
    m /= double(C);
    double v = 0.0;
    for (int64_t c = 0; c < C; ++c) v += (x[i * C + c] - m) * (x[i * C + c] - m);
    v /= double(C);
    const double s = 1.0 / std::sqrt(v + eps);
    for (int64_t c = 0; c < C; ++c) out[i * C + c] = (x[i * C + c] - m) * s * w[c] + b[c];
    if (mean) (*mean)[i] = m;
    if (rstd) (*rstd)[i] = s;
  }
  return out;
}

DVec gelu_ref(const DVec& x) {
  const double k = std::sqrt(2.0 / std::numbers::pi);
  DVec out(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    out[i] = 0.5 * x[i] * (1.0 + std::tanh(k * (x[i] + 0.044715 * x[i] * x[i] * x[i])));
  return out;
}

DVec attention_ref(const DVec& qkv, int64_t B, int64_t T, int64_t C, int64_t H,
                   DVec* lse = nullptr) {
  const int64_t hs = C / H, C3 = 3 * C;
  DVec out(sz(B * T * C), 0.0);
  if (lse) lse->assign(sz(B * H * T), 0.0);
  DVec p(sz(T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        const double* q = &qkv[b * T * C3 + i * C3 + h * hs];
        double mx = -INFINITY;
        for (int64_t j = 0; j <= i; ++j) {
          const double* k = &qkv[b * T * C3 + j * C3 + C + h * hs];
          double s = 0.0;
          for (int64_t d = 0; d < hs; ++d) s += q[d] * k[d];
          p[j] = s / std::sqrt(double(hs));
          mx = std::max(mx, p[j]);
        }
        double sum = 0.0;
        for (int64_t j = 0; j <= i; ++j) sum += (p[j] = std::exp(p[j] - mx));
        if (lse) (*lse)[sz((b * H + h) * T + i)] = mx + std::log(sum);
        for (int64_t j = 0; j <= i; ++j) {
          p[j] /= sum;
          const double* v = &qkv[b * T * C3 + j * C3 + 2 * C + h * hs];
          for (int64_t d = 0; d < hs; ++d) out[(b * T + i) * C + h * hs + d] += p[j] * v[d];
        }
      }
  return out;
}

DVec embedding_ref(const std::vector<int32_t>& tokens, const DVec& wte, const DVec& wpe, int64_t B,
                   int64_t T, int64_t C) {
  DVec out(sz(B * T * C));
  for (int64_t i = 0; i < B * T; ++i)
    for (int64_t c = 0; c < C; ++c) out[i * C + c] = wte[tokens[i] * C + c] + wpe[(i % T) * C + c];
  return out;
}

// Per-row cross-entropy over the first V of Vp columns, log-sum-exp in double; a negative
// target (a padding row): loss 0.
DVec cross_entropy_ref(const DVec& logits, const std::vector<int32_t>& targets, int64_t BT,
                       int64_t V, int64_t Vp) {
  DVec losses(sz(BT));
  for (int64_t i = 0; i < BT; ++i) {
    const double* row = &logits[i * Vp];
    double mx = row[0];
    for (int64_t j = 1; j < V; ++j) mx = std::max(mx, row[j]);
    double sum = 0.0;
    for (int64_t j = 0; j < V; ++j) sum += std::exp(row[j] - mx);
    losses[i] = targets[i] < 0 ? 0.0 : mx + std::log(sum) - row[targets[i]];
  }
  return losses;
}

// Label-smoothed cross-entropy per row, written as PyTorch's CrossEntropyLoss(label_smoothing = e)
// defines it: -(1 - e) log p_target - (e / V) sum_c log p_c over the first V of Vp columns;
// a negative target: loss 0.
DVec smoothed_ce_ref(const DVec& logits, const std::vector<int32_t>& targets, int64_t BT,
                     int64_t V, int64_t Vp, double e) {
  DVec losses(sz(BT), 0.0);
  for (int64_t i = 0; i < BT; ++i) {
    if (targets[i] < 0) continue;
    const double* row = &logits[i * Vp];
    double mx = row[0];
    for (int64_t j = 1; j < V; ++j) mx = std::max(mx, row[j]);
    double sum = 0.0;
    for (int64_t j = 0; j < V; ++j) sum += std::exp(row[j] - mx);
    const double lse = mx + std::log(sum);
    double mean_nll = 0.0;
    for (int64_t j = 0; j < V; ++j) mean_nll += (lse - row[j]) / double(V);
    losses[i] = (1.0 - e) * (lse - row[targets[i]]) + e * mean_nll;
  }
  return losses;
}

DVec rmsnorm_ref(const DVec& x, const DVec& w, int64_t rows, int64_t C, double eps,
                 DVec* rstd = nullptr) {
  DVec out(sz(rows * C));
  for (int64_t i = 0; i < rows; ++i) {
    double ms = 0.0;
    for (int64_t c = 0; c < C; ++c) ms += x[i * C + c] * x[i * C + c];
    const double s = 1.0 / std::sqrt(ms / double(C) + eps);
    for (int64_t c = 0; c < C; ++c) out[i * C + c] = x[i * C + c] * s * w[c];
    if (rstd) (*rstd)[i] = s;
  }
  return out;
}

// RoPE written as complex multiplication: the pair (x[i], x[i + hd/2]) is x[i] + i x[i + hd/2],
// turned by e^{i pos / theta^(2i/hd)}. Columns past the heads pass through.
DVec rope_ref(const DVec& x, int64_t ld, int64_t rows, int64_t row0, int64_t T, int64_t n_heads,
              int64_t hd, double theta) {
  DVec y = x;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < n_heads; ++h)
      for (int64_t i = 0; i < hd / 2; ++i) {
        const size_t a = sz(r * ld + h * hd + i), b = a + sz(hd / 2);
        const double angle = double((row0 + r) % T) / std::pow(theta, double(2 * i) / double(hd));
        const std::complex<double> z = std::complex<double>(x[a], x[b]) * std::polar(1.0, angle);
        y[a] = z.real();
        y[b] = z.imag();
      }
  return y;
}

DVec swiglu_ref(const DVec& gu, int64_t rows, int64_t F) {
  DVec out(sz(rows * F));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < F; ++j) {
      const double g = gu[r * 2 * F + j], u = gu[r * 2 * F + F + j];
      out[r * F + j] = g / (1.0 + std::exp(-g)) * u;
    }
  return out;
}

// Where q, k and v sit in one input buffer X: q row t (of B*Tq) at X[qoff + t*ldq], k and v row t
// (of B*Tk) at X[koff + t*ldkv] and X[voff + t*ldkv]. Separate buffers and slices of one fused
// q|k|v buffer are both a layout, so one reference and one gradient check serve both.
struct AttnLayout {
  int64_t qoff, koff, voff, ldq, ldkv;
};

// Grouped-query attention straight from the definition: per query, scores over the visible keys,
// softmax, weighted sum of values. Invisible keys get probability 0.
DVec gqa_attention_ref(const DVec& X, const AttnLayout& l, const ops::AttentionShape& s,
                       DVec* lse = nullptr) {
  const int64_t hd = s.hd, C = s.H * hd;
  DVec out(sz(s.B * s.Tq * C), 0.0);
  if (lse) lse->assign(sz(s.B * s.H * s.Tq), 0.0);
  DVec p(sz(s.Tk));
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h) {
      const int64_t g = h / (s.H / s.Hkv);  // repeat_kv: query heads [g*rep, (g+1)*rep) share g
      for (int64_t i = 0; i < s.Tq; ++i) {
        auto visible = [&](int64_t j) {
          return (!s.causal || j <= i) && (!s.key_len || j < s.key_len[b]) &&
                 (!s.seg_start || j >= s.seg_start[b * s.Tq + i]);
        };
        const double* q = &X[sz(l.qoff + (b * s.Tq + i) * l.ldq + h * hd)];
        double mx = -INFINITY;
        for (int64_t j = 0; j < s.Tk; ++j) {
          if (!visible(j)) continue;
          const double* k = &X[sz(l.koff + (b * s.Tk + j) * l.ldkv + g * hd)];
          double dotqk = 0.0;
          for (int64_t d = 0; d < hd; ++d) dotqk += q[d] * k[d];
          p[j] = dotqk / std::sqrt(double(hd));
          mx = std::max(mx, p[j]);
        }
        double sum = 0.0;
        for (int64_t j = 0; j < s.Tk; ++j)
          if (visible(j)) sum += (p[j] = std::exp(p[j] - mx));
        if (lse) (*lse)[sz((b * s.H + h) * s.Tq + i)] = mx + std::log(sum);
        for (int64_t j = 0; j < s.Tk; ++j) {
          if (!visible(j)) continue;
          const double pj = p[j] / sum;
          const double* v = &X[sz(l.voff + (b * s.Tk + j) * l.ldkv + g * hd)];
          for (int64_t d = 0; d < hd; ++d) out[sz((b * s.Tq + i) * C + h * hd + d)] += pj * v[d];
        }
      }
    }
  return out;
}


// ---------------------------------------------------------------------------------------------
// gemm

struct GemmShape {
  bool ta, tb;
  int64_t M, N, K;
};

// One gemm problem with padded leading dimensions (strides must be used), random A, B and C, and
// its double reference. run() calls ops::gemm on a fresh guarded copy of C and checks each element
// against the classic error bound |c - c_ref| <= gamma * (|alpha| sum_k |a_ik b_kj| + |beta c_ij|),
// gamma = (K+2) u, doubled for slack (any summation order, FMA or not, satisfies it), that the
// padding of C was not written, that nothing was written around A, B or C and that A and B came
// back unchanged; it returns C (with padding).
struct GemmCase {
  GemmShape s;
  float alpha, beta;
  int64_t lda, ldb, ldc;
  Vec A, B, C0;
  DVec ref, bound;
  static constexpr float kSentinel = 12345.0f;

  GemmCase(const GemmShape& shape, float alpha_, float beta_, uint32_t seed)
      : s(shape), alpha(alpha_), beta(beta_) {
    std::mt19937 rng(seed);
    const int64_t arows = s.ta ? s.K : s.M, acols = s.ta ? s.M : s.K;
    const int64_t brows = s.tb ? s.N : s.K, bcols = s.tb ? s.K : s.N;
    lda = acols + 3, ldb = bcols + 2, ldc = s.N + 5;
    A = randn(rng, sz(arows * lda));
    B = randn(rng, sz(brows * ldb));
    C0 = randn(rng, sz(s.M * ldc));
    for (int64_t i = 0; i < s.M; ++i)
      for (int64_t j = s.N; j < ldc; ++j) C0[sz(i * ldc + j)] = kSentinel;
    ref = to_d(C0);
    bound.assign(ref.size(), 0.0);
    gemm_ref(s.ta, s.tb, s.M, s.N, s.K, alpha, A, lda, B, ldb, beta, ref, ldc, &bound);
  }

  std::string name() const {
    return "gemm ta=" + std::to_string(s.ta) + " tb=" + std::to_string(s.tb) +
           " M=" + std::to_string(s.M) + " N=" + std::to_string(s.N) + " K=" + std::to_string(s.K);
  }

  Vec run() const {
    GuardedF a(A), b(B), c(C0);
    ops::gemm(s.ta, s.tb, s.M, s.N, s.K, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
    a.intact(name() + ": A");
    b.intact(name() + ": B");
    c.intact(name() + ": C");
    EXPECT_TRUE(same_bits(a.values(), A)) << name() << " wrote into A";
    EXPECT_TRUE(same_bits(b.values(), B)) << name() << " wrote into B";
    const Vec C = c.values();
    const double gamma = 2.0 * double(s.K + 2) * (FLT_EPSILON / 2);
    // Every element is checked; the first failures are reported one by one, the rest counted.
    int64_t bad = 0, bad_pad = 0;
    for (int64_t i = 0; i < s.M; ++i) {
      for (int64_t j = 0; j < s.N; ++j) {
        const size_t at = sz(i * ldc + j);
        const bool ok = std::abs(C[at] - ref[at]) <= gamma * bound[at] + 1e-30;
        if (!ok && ++bad <= 3)
          EXPECT_LE(std::abs(C[at] - ref[at]), gamma * bound[at] + 1e-30)
              << name() << " at (" << i << "," << j << ")";
      }
      for (int64_t j = s.N; j < ldc; ++j)
        if (C[sz(i * ldc + j)] != kSentinel && ++bad_pad <= 3)
          EXPECT_EQ(C[sz(i * ldc + j)], kSentinel) << "gemm wrote into the ldc padding";
    }
    EXPECT_EQ(bad, 0) << "elements beyond the error bound, of " << s.M * s.N;
    EXPECT_EQ(bad_pad, 0) << "padding elements written";
    if (speed_mode())
      std::printf("[speed] %s %.1f us\n", name().c_str(), best_us([&] {
                    ops::gemm(s.ta, s.tb, s.M, s.N, s.K, alpha, a.data(), lda, b.data(), ldb, beta,
                              c.data(), ldc);
                  }));
    return C;
  }
};

// Shapes run with every transpose combination. The first is run with three (alpha, beta) pairs:
// beta = 0 (plain product), and beta != 0 (accumulate into C), with alpha != 1.
struct GemmRow {
  int64_t M, N, K;
  float alpha, beta;
};
const GemmRow kGemmRows[] = {
    {5, 7, 6, 1.0f, 0.0f},    {5, 7, 6, 0.75f, 1.0f}, {5, 7, 6, -1.5f, 0.5f},
    {33, 17, 70, 1.0f, 1.0f},  // larger, odd sizes: the backend's blocking and tails
    // odd sizes: 1, primes, non-multiples of the SIMD width (16) and of 32 / 64
    {1, 1, 1, 1.0f, 0.0f},    {1, 17, 3, 0.5f, 1.0f}, {31, 1, 5, 1.0f, 1.0f},
    {17, 33, 65, 1.0f, 0.0f}, {67, 13, 1, -1.0f, 0.25f},
};

TEST(KernelsGemm, AllTransposeCombosMatchDoubleReference) {
  uint32_t seed = 1;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (const GemmRow& r : kGemmRows)
        GemmCase({ta, tb, r.M, r.N, r.K}, r.alpha, r.beta, seed++).run();
}

TEST(KernelsGemm, ThreadSplitAlongNAndMMatchesDoubleReference) {
  // Above 4e6 flops, a gemm called outside a parallel region with more than one OpenMP thread
  // cuts C into one block per thread along its larger dimension, each block one library call
  // (kernels/cpu/gemm_split.h): along N when N >= M, else along M. Each split and transpose, with
  // padded strides, on 1 thread (one call, no split), 2 and 3 threads (uneven blocks, edges on
  // multiples of 16), against the double reference to the same bound as above, and run twice:
  // a given thread count must reproduce its result exactly.
  // With alpha = 1 (every split call trellis makes: the Linear layers; attention's scaled gemm
  // runs inside its own parallel loop, unsplit) the cut does not change a bit, as measured with
  // this oneDNN: the results must equal the 1-thread one exactly — along N on every CPU, along M
  // where oneDNN runs its AVX-512 kernels (its AVX2 kernels sum a block's last rows in another
  // order: on a Zen 3, 2 or 3 threads change bits of every transpose case). The docs promise less
  // (reproducible for a given thread count): with alpha != 1 and B transposed, oneDNN sums some
  // block widths in another order (3 threads: ~6k of the 11k elements differ, within the
  // bound), so there only the bound and run-to-run equality are checked.
  struct Dims {
    int64_t M, N, K;
    const char* split;
  };
  const Dims dims[] = {{37, 301, 190, "N"}, {301, 37, 190, "M"}};
  const float alpha_beta[][2] = {{1.0f, 0.0f}, {1.0f, 1.0f}, {0.75f, 0.5f}};
  const int saved = omp_get_max_threads();
  uint32_t seed = 100;
  for (const Dims& d : dims) {
    ASSERT_GE(2.0 * double(d.M) * double(d.N) * double(d.K), 4e6) << "below the split threshold";
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (const auto& ab : alpha_beta) {
          const float alpha = ab[0], beta = ab[1];
          const GemmCase g({ta, tb, d.M, d.N, d.K}, alpha, beta, seed++);
          std::vector<Vec> results;
          for (int threads : {1, 2, 3}) {
            SCOPED_TRACE(::testing::Message()
                         << "split along " << d.split << ", " << threads << " threads, ta=" << ta
                         << " tb=" << tb << " alpha " << alpha << " beta " << beta);
            omp_set_num_threads(threads);
            results.push_back(g.run());
            EXPECT_TRUE(g.run() == results.back()) << "not reproducible run to run";
          }
          omp_set_num_threads(saved);
          const bool exact_split = d.split[0] == 'N' || trellis::cpu_isa() >= trellis::Isa::Avx512;
          if (alpha == 1.0f && exact_split)
            for (int k : {1, 2})
              EXPECT_TRUE(results[size_t(k)] == results[0])
                  << k + 1 << " threads differ from 1: split along " << d.split << " ta=" << ta
                  << " tb=" << tb << " beta " << beta;
        }
  }
  omp_set_num_threads(saved);
}

TEST(KernelsGemm, BetaZeroDoesNotReadC) {
  // attention_forward and linear_forward (no bias) gemm with beta = 0 into uninitialised memory:
  // BLAS semantics say C is then write-only, so even NaN there must not leak into the result.
  std::mt19937 rng(7);
  const int64_t M = 4, N = 6, K = 5;
  const Vec A = randn(rng, sz(M * K)), B = randn(rng, sz(K * N));
  Vec C(sz(M * N), std::numeric_limits<float>::quiet_NaN());
  ops::gemm(false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, C.data(), N);
  DVec ref(C.size(), 0.0);
  gemm_ref(false, false, M, N, K, 1.0, A, K, B, N, 0.0, ref, N, nullptr);
  for (float c : C) EXPECT_TRUE(std::isfinite(c));
  EXPECT_LE(rel_err(C, ref), kFwdTol);
}

TEST(KernelsGemm, CallableFromInsideAnOpenMPRegion) {
  // The attention kernels call gemm from inside their own parallel loops; each call must give the
  // same result as when called serially.
  std::mt19937 rng(8);
  const int64_t M = 6, N = 5, K = 7, n = 8;
  const Vec A = randn(rng, sz(n * M * K)), B = randn(rng, sz(n * K * N));
  Vec serial(sz(n * M * N), 0.0f), parallel(sz(n * M * N), 0.0f);
  for (int64_t r = 0; r < n; ++r)
    ops::gemm(false, false, M, N, K, 1.0f, A.data() + r * M * K, K, B.data() + r * K * N, N, 0.0f,
              serial.data() + r * M * N, N);
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t r = 0; r < n; ++r)
    ops::gemm(false, false, M, N, K, 1.0f, A.data() + r * M * K, K, B.data() + r * K * N, N, 0.0f,
              parallel.data() + r * M * N, N);
  EXPECT_EQ(serial, parallel);
}

// ---------------------------------------------------------------------------------------------
// linear

struct LinearShape {
  int64_t BT, IC, OC;
  bool bias;
};

OpCase linear_case(const LinearShape& s, uint32_t seed) {
  std::mt19937 rng(seed);
  OpCase c;
  c.name = shape_name("linear", {{"BT", s.BT}, {"IC", s.IC}, {"OC", s.OC}, {"bias", s.bias}});
  c.inputs = {{"inp", randn(rng, sz(s.BT * s.IC))}, {"w", randn(rng, sz(s.IC * s.OC), 0.5f)}};
  if (s.bias) c.inputs.push_back({"bias", randn(rng, sz(s.OC))});
  c.outputs = {{"out", sz(s.BT * s.OC)}};  // NaN before the call: the forward must overwrite
  c.forward = [s](const CPtrs& in, const Ptrs& out) {
    ops::linear_forward(out[0], in[0], in[1], s.bias ? in[2] : nullptr, s.BT, s.IC, s.OC);
  };
  c.reference = [s](const std::vector<DVec>& in) {
    return std::vector<DVec>{linear_ref(in[0], in[1], s.bias ? &in[2] : nullptr, s.BT, s.IC, s.OC)};
  };
  c.backward = [s](const float* dout, const CPtrs& in, const CPtrs&, const Ptrs& g) {
    ops::linear_backward(g[0], g[1], s.bias ? g[2] : nullptr, dout, in[0], in[1], s.BT, s.IC,
                         s.OC);
  };
  return c;
}

const LinearShape kLinearShapes[] = {
    {kB * kT, kC, 3 * kC, true}, {kB * kT, kC, 3 * kC, false}, {kB * kT, 4 * kC, kC, true},
    {3, 5, 130, true},  // OC > 64: dbias is split in column chunks
    {1, 1, 1, true},    {1, 17, 1, false}, {7, 3, 67, true}, {5, 19, 33, true}, {13, 2, 17, false},
};

TEST(KernelsLinear, ForwardAndGradients) {
  uint32_t seed = 11;
  for (const LinearShape& s : kLinearShapes) {
    run_case(linear_case(s, seed), seed + 500);
    ++seed;
  }
}

TEST(KernelsLinear, NullDinpSkipsInputGradient) {
  // dinp == null (the first layer's input needs no gradient): dw and dbias must still be right.
  std::mt19937 rng(15);
  const int64_t BT = kB * kT, IC = kC, OC = 2 * kC;
  const Vec inp = randn(rng, sz(BT * IC)), w = randn(rng, sz(IC * OC));
  const Vec dout = randn(rng, sz(BT * OC));
  Vec dw1(w.size(), 0.0f), db1(sz(OC), 0.0f), dx1(inp.size(), 0.0f);
  Vec dw2(w.size(), 0.0f), db2(sz(OC), 0.0f);
  ops::linear_backward(dx1.data(), dw1.data(), db1.data(), dout.data(), inp.data(), w.data(), BT,
                       IC, OC);
  ops::linear_backward(nullptr, dw2.data(), db2.data(), dout.data(), inp.data(), w.data(), BT, IC,
                       OC);
  EXPECT_EQ(dw1, dw2);
  EXPECT_EQ(db1, db2);
}


// ---------------------------------------------------------------------------------------------
// layernorm

// Row 0: tiny spread (variance ~4e-6 < eps), so eps visibly matters. Other rows: offsets, so the
// mean must really be removed (LayerNorm) or is kept (RMSNorm). A single row stays O(1): alone,
// its tiny mean would be a cancellation that no normwise bound fits.
Vec norm_input(std::mt19937& rng, int64_t rows, int64_t C) {
  Vec inp = randn(rng, sz(rows * C), 2.0f);
  for (int64_t c = 0; rows > 1 && c < C; ++c) inp[sz(c)] *= 1e-3f;
  for (int64_t i = 1; i < rows; ++i)
    for (int64_t c = 0; c < C; ++c) inp[sz(i * C + c)] += float(i) - 1.5f;
  return inp;
}

Vec around_one(std::mt19937& rng, int64_t n) {
  Vec w = randn(rng, sz(n), 0.5f);
  for (auto& x : w) x += 1.0f;
  return w;
}

struct NormShape {
  int64_t rows, C;
};

OpCase layernorm_case(const NormShape& s, uint32_t seed) {
  std::mt19937 rng(seed);
  const float eps = 1e-5f;
  OpCase c;
  c.name = shape_name("layernorm", {{"BT", s.rows}, {"C", s.C}});
  Vec inp = norm_input(rng, s.rows, s.C);
  Vec weight = around_one(rng, s.C);
  c.inputs = {{"inp", inp}, {"weight", weight}, {"bias", randn(rng, sz(s.C), 0.5f)}};
  c.outputs = {{"out", sz(s.rows * s.C)}, {"mean", sz(s.rows)}, {"rstd", sz(s.rows)}};
  c.forward = [s, eps](const CPtrs& in, const Ptrs& out) {
    ops::layernorm_forward(out[0], out[1], out[2], in[0], in[1], in[2], s.rows, s.C, eps);
  };
  c.reference = [s, eps](const std::vector<DVec>& in) {
    DVec mean(sz(s.rows)), rstd(sz(s.rows));
    DVec out = layernorm_ref(in[0], in[1], in[2], s.rows, s.C, eps, &mean, &rstd);
    return std::vector<DVec>{out, mean, rstd};
  };
  c.backward = [s](const float* dout, const CPtrs& in, const CPtrs& saved, const Ptrs& g) {
    ops::layernorm_backward(g[0], g[1], g[2], dout, in[0], in[1], saved[1], saved[2], s.rows, s.C);
  };
  return c;
}

// Odd sizes start at C = 3: a row of 2 (LayerNorm) or 1 (RMSNorm) normalises to constants, whose
// input gradient is ~0 and leaves nothing to check.
const NormShape kLayerNormShapes[] = {
    {kB * kT, kC}, {3, 130},  // C > 64: dweight/dbias are split in column chunks
    {1, 3},        {1, 5},   {7, 17}, {2, 67}, {5, 33}, {4, 16},
};

TEST(KernelsLayerNorm, ForwardAndGradients) {
  uint32_t seed = 21;
  for (const NormShape& s : kLayerNormShapes) {
    run_case(layernorm_case(s, seed), seed + 500);
    ++seed;
  }
}

TEST(KernelsLayerNorm, NormalisesRows) {
  // With unit weight and zero bias every output row has mean 0 and variance 1/(1 + eps/var).
  std::mt19937 rng(23);
  const int64_t BT = 4, C = 32;
  Vec inp = randn(rng, sz(BT * C), 3.0f);
  for (auto& x : inp) x += 10.0f;
  const Vec w(sz(C), 1.0f), b(sz(C), 0.0f);
  Vec out(inp.size()), mean(sz(BT)), rstd(sz(BT));
  ops::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), BT,
                         C);
  for (int64_t i = 0; i < BT; ++i) {
    double m = 0.0, v = 0.0;
    for (int64_t c = 0; c < C; ++c) m += out[i * C + c];
    m /= C;
    for (int64_t c = 0; c < C; ++c) v += (out[i * C + c] - m) * (out[i * C + c] - m);
    v /= C;
    EXPECT_NEAR(m, 0.0, 1e-5);
    EXPECT_NEAR(v, 1.0, 1e-4);
  }
}


// ---------------------------------------------------------------------------------------------
// rmsnorm

OpCase rmsnorm_case(const NormShape& s, uint32_t seed) {
  std::mt19937 rng(seed);
  const float eps = 1e-5f;
  OpCase c;
  c.name = shape_name("rmsnorm", {{"rows", s.rows}, {"C", s.C}});
  Vec inp = norm_input(rng, s.rows, s.C);
  c.inputs = {{"inp", inp}, {"weight", around_one(rng, s.C)}};
  c.outputs = {{"out", sz(s.rows * s.C)}, {"rstd", sz(s.rows)}};
  c.forward = [s, eps](const CPtrs& in, const Ptrs& out) {
    ops::rmsnorm_forward(out[0], out[1], in[0], in[1], s.rows, s.C, eps);
  };
  c.reference = [s, eps](const std::vector<DVec>& in) {
    DVec rstd(sz(s.rows));
    DVec out = rmsnorm_ref(in[0], in[1], s.rows, s.C, eps, &rstd);
    return std::vector<DVec>{out, rstd};
  };
  c.backward = [s](const float* dout, const CPtrs& in, const CPtrs& saved, const Ptrs& g) {
    ops::rmsnorm_backward(g[0], g[1], dout, in[0], in[1], saved[1], s.rows, s.C);
  };
  return c;
}

const NormShape kRmsNormShapes[] = {
    {kB * kT, kC}, {3, 130},  // C > 64: dweight is split in column chunks
    {1, 3},        {7, 17},  {5, 33}, {2, 67}, {3, 16},
};

TEST(KernelsRmsNorm, ForwardAndGradients) {
  uint32_t seed = 24;
  for (const NormShape& s : kRmsNormShapes) {
    run_case(rmsnorm_case(s, seed), seed + 500);
    ++seed;
  }
}

// ---------------------------------------------------------------------------------------------
// rope

// rows rows of stride ld = n_heads * hd + 3 (wider than the heads: the extra columns must pass
// through untouched), starting at row0 of a [B*T] batch.
struct RopeShape {
  int64_t rows, row0, T, n_heads, hd;
  float theta;
};

OpCase rope_case(const RopeShape& s, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t ld = s.n_heads * s.hd + 3;
  OpCase c;
  c.name = shape_name("rope", {{"rows", s.rows}, {"row0", s.row0}, {"T", s.T},
                               {"heads", s.n_heads}, {"hd", s.hd}});
  c.inputs = {{"x", randn(rng, sz(s.rows * ld))}};
  c.outputs = {{"y", sz(s.rows * ld)}};
  // rope works in place: the call rotates a copy of x in the output buffer.
  c.forward = [s, ld](const CPtrs& in, const Ptrs& out) {
    std::memcpy(out[0], in[0], sz(s.rows * ld) * sizeof(float));
    ops::rope_forward(out[0], ld, s.rows, s.row0, s.T, s.n_heads, s.hd, s.theta);
  };
  c.reference = [s, ld](const std::vector<DVec>& in) {
    return std::vector<DVec>{rope_ref(in[0], ld, s.rows, s.row0, s.T, s.n_heads, s.hd, s.theta)};
  };
  // rope_backward maps dout to dinp in place (no accumulation: there is nothing to add to).
  c.accumulates = false;
  c.backward = [s, ld](const float* dout, const CPtrs&, const CPtrs&, const Ptrs& g) {
    std::memcpy(g[0], dout, sz(s.rows * ld) * sizeof(float));
    ops::rope_backward(g[0], ld, s.rows, s.row0, s.T, s.n_heads, s.hd, s.theta);
  };
  return c;
}

const RopeShape kRopeShapes[] = {
    {kB * kT, 0, kT, 2, 8, 10000.0f},
    {7, 3, 4, 3, 6, 10000.0f},          // row0 != 0, T < rows: positions wrap
    {5, 1000, 1024, 1, 16, 500000.0f},  // large angles: computed in double
    {1, 0, 1, 1, 2, 10000.0f},          {3, 5, 7, 5, 2, 10000.0f},
    {11, 2, 13, 1, 34, 10000.0f},       {4, 0, 4, 2, 18, 10000.0f},
};

TEST(KernelsRope, ForwardMatchesClosedFormAndGradient) {
  uint32_t seed = 26;
  for (const RopeShape& s : kRopeShapes) {
    const CaseResult r = run_case(rope_case(s, seed), seed + 500);
    ++seed;
    // The columns past the heads pass through bit for bit.
    const int64_t ld = s.n_heads * s.hd + 3;
    for (int64_t row = 0; row < s.rows; ++row)
      for (int64_t col = s.n_heads * s.hd; col < ld; ++col)
        EXPECT_EQ(r.outputs[0][sz(row * ld + col)], r.inputs[0][sz(row * ld + col)]);
  }
}

TEST(KernelsRope, OddHeadWidthIsAnError) {
  Vec x(12, 1.0f);
  EXPECT_THROW(ops::rope_forward(x.data(), 6, 2, 0, 2, 2, 3, 10000.0f), trellis::Error);
}

// ---------------------------------------------------------------------------------------------
// gelu

OpCase gelu_case(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  OpCase c;
  c.name = shape_name("gelu", {{"n", n}});
  Vec x = randn(rng, sz(n), 2.0f);
  if (n >= 5) x[0] = 0.0f, x[1] = -6.0f, x[2] = 6.0f, x[3] = -0.5f, x[4] = 3.0f;
  c.inputs = {{"inp", x}};
  c.outputs = {{"out", sz(n)}};
  c.forward = [n](const CPtrs& in, const Ptrs& out) { ops::gelu_forward(out[0], in[0], n); };
  c.reference = [](const std::vector<DVec>& in) { return std::vector<DVec>{gelu_ref(in[0])}; };
  c.backward = [n](const float* dout, const CPtrs& in, const CPtrs&, const Ptrs& g) {
    ops::gelu_backward(g[0], in[0], dout, n);
  };
  return c;
}

const int64_t kGeluSizes[] = {203,  // odd: SIMD tails
                              1, 2, 15, 16, 17, 31, 33, 64, 67, 1009};

TEST(KernelsGelu, ForwardAndGradient) {
  uint32_t seed = 31;
  for (int64_t n : kGeluSizes) {
    const CaseResult r = run_case(gelu_case(n, seed), seed + 500);
    ++seed;
    if (n < 5) continue;
    const Vec& out = r.outputs[0];
    EXPECT_EQ(out[0], 0.0f);
    EXPECT_NEAR(out[2], 6.0f, 1e-5f);  // ~identity for large positive x
    EXPECT_NEAR(out[1], 0.0f, 1e-5f);  // ~0 for large negative x
  }
}

// gelu_bias_forward: inp[r, :] += bias (kept for gelu_backward, one rounding per element: exact
// against the double sum), out = GELU(inp); and bit for bit the bias add then gelu_forward.
struct RowsCols {
  int64_t rows, C;
};
const RowsCols kGeluBiasShapes[] = {{5, 19},  // C odd: per-row SIMD tails
                                    {1, 1}, {3, 16}, {7, 33}, {2, 67}};

TEST(KernelsGelu, BiasFusedIntoForwardEqualsBiasThenGelu) {
  uint32_t seed = 32;
  for (const RowsCols& s : kGeluBiasShapes) {
    std::mt19937 rng(seed++);
    OpCase c;
    c.name = shape_name("gelu_bias", {{"rows", s.rows}, {"C", s.C}});
    c.inputs = {{"inp", randn(rng, sz(s.rows * s.C), 2.0f)}, {"bias", randn(rng, sz(s.C))}};
    c.outputs = {{"pre-activation", sz(s.rows * s.C), true}, {"out", sz(s.rows * s.C)}};
    c.forward = [s](const CPtrs& in, const Ptrs& out) {
      std::memcpy(out[0], in[0], sz(s.rows * s.C) * sizeof(float));  // updated in place
      ops::gelu_bias_forward(out[1], out[0], in[1], s.rows, s.C);
    };
    c.reference = [s](const std::vector<DVec>& in) {
      DVec pre = in[0];
      for (int64_t r = 0; r < s.rows; ++r)
        for (int64_t col = 0; col < s.C; ++col) pre[sz(r * s.C + col)] += in[1][sz(col)];
      DVec rounded(pre.size());  // GELU of the float pre-activation the kernel keeps
      for (size_t i = 0; i < pre.size(); ++i) rounded[i] = double(float(pre[i]));
      return std::vector<DVec>{pre, gelu_ref(rounded)};
    };
    const CaseResult r = run_case(c, seed + 500);
    Vec want_in = r.inputs[0], want_out(want_in.size());
    for (int64_t row = 0; row < s.rows; ++row)
      for (int64_t col = 0; col < s.C; ++col) want_in[sz(row * s.C + col)] += r.inputs[1][sz(col)];
    ops::gelu_forward(want_out.data(), want_in.data(), s.rows * s.C);
    EXPECT_EQ(r.outputs[0], want_in);  // the pre-activation is kept for gelu_backward
    EXPECT_EQ(r.outputs[1], want_out);
  }
}

// ---------------------------------------------------------------------------------------------
// swiglu

OpCase swiglu_case(const RowsCols& s, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t rows = s.rows, F = s.C;
  OpCase c;
  c.name = shape_name("swiglu", {{"rows", rows}, {"F", F}});
  Vec gu = randn(rng, sz(rows * 2 * F), 2.0f);
  if (F >= 4) gu[0] = 0.0f, gu[1] = -30.0f, gu[2] = 30.0f, gu[3] = -800.0f;  // exp(800): silu = 0
  c.inputs = {{"gu", gu}};
  c.outputs = {{"out", sz(rows * F)}};
  c.forward = [rows, F](const CPtrs& in, const Ptrs& out) {
    ops::swiglu_forward(out[0], in[0], rows, F);
  };
  c.reference = [rows, F](const std::vector<DVec>& in) {
    return std::vector<DVec>{swiglu_ref(in[0], rows, F)};
  };
  c.backward = [rows, F](const float* dout, const CPtrs& in, const CPtrs&, const Ptrs& g) {
    ops::swiglu_backward(g[0], in[0], dout, rows, F);
  };
  return c;
}

const RowsCols kSwiGluShapes[] = {{3, 11},  // odd: SIMD tails
                                  {1, 1}, {2, 16}, {5, 17}, {4, 33}, {1, 67}};

TEST(KernelsSwiGlu, ForwardAndGradient) {
  uint32_t seed = 32;
  for (const RowsCols& s : kSwiGluShapes) {
    const CaseResult r = run_case(swiglu_case(s, seed), seed + 500);
    ++seed;
    if (s.C < 4) continue;
    EXPECT_EQ(r.outputs[0][0], 0.0f);
    EXPECT_EQ(r.outputs[0][3], 0.0f);
  }
}

// ---------------------------------------------------------------------------------------------
// attention

// GPT-2's fused-qkv causal attention.
struct FusedAttnShape {
  int64_t B, T, C, H;
};

OpCase fused_attention_case(const FusedAttnShape& s, uint32_t seed) {
  std::mt19937 rng(seed);
  OpCase c;
  c.name = shape_name("attention qkv", {{"B", s.B}, {"T", s.T}, {"C", s.C}, {"H", s.H}});
  c.inputs = {{"qkv", randn(rng, sz(s.B * s.T * 3 * s.C))}};
  c.outputs = {{"out", sz(s.B * s.T * s.C)}, {"lse", sz(s.B * s.H * s.T)}};
  c.forward = [s](const CPtrs& in, const Ptrs& out) {
    ops::attention_forward(out[0], out[1], in[0], s.B, s.T, s.C, s.H);
  };
  c.reference = [s](const std::vector<DVec>& in) {
    DVec lse;
    DVec out = attention_ref(in[0], s.B, s.T, s.C, s.H, &lse);
    return std::vector<DVec>{out, lse};
  };
  c.backward = [s](const float* dout, const CPtrs& in, const CPtrs& saved, const Ptrs& g) {
    ops::attention_backward(g[0], dout, in[0], saved[0], saved[1], s.B, s.T, s.C, s.H);
  };
  return c;
}

const FusedAttnShape kFusedAttnShapes[] = {
    {kB, kT, kC, kH}, {1, 1, 2, 1}, {3, 7, 6, 3}, {2, 13, 12, 3}, {1, 17, 34, 1},
};

TEST(KernelsAttention, ForwardLogsumexpAndGradients) {
  uint32_t seed = 41;
  for (const FusedAttnShape& s : kFusedAttnShapes) {
    run_case(fused_attention_case(s, seed), seed + 500);
    ++seed;
  }
}

TEST(KernelsAttention, FutureTokensDoNotChangeEarlierOutputs) {
  const int64_t B = kB, T = kT, C = kC, H = kH, C3 = 3 * C;
  std::mt19937 rng(42);
  const Vec qkv = randn(rng, sz(B * T * C3));
  Vec out0(sz(B * T * C)), lse0(sz(B * H * T));
  ops::attention_forward(out0.data(), lse0.data(), qkv.data(), B, T, C, H);
  for (int64_t tf = 1; tf < T; ++tf) {
    // Replace everything (q, k and v, all heads) of token tf in every batch row.
    Vec mod = qkv;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t c = 0; c < C3; ++c) mod[(b * T + tf) * C3 + c] = 5.0f * float(c % 7) - 11.0f;
    Vec out1(out0.size()), lse1(lse0.size());
    ops::attention_forward(out1.data(), lse1.data(), mod.data(), B, T, C, H);
    bool later_changed = false;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t c = 0; c < C; ++c) {
          const size_t at = sz((b * T + t) * C + c);
          if (t < tf)
            EXPECT_EQ(out0[at], out1[at]) << "token " << tf << " leaked into t=" << t;
          else if (out0[at] != out1[at])
            later_changed = true;
        }
    EXPECT_TRUE(later_changed) << "sanity: changing token " << tf << " changed nothing";
  }
}

TEST(KernelsAttention, BackwardSendsNoGradientToFutureTokens) {
  // d out[t] / d qkv[t'] = 0 for t' > t. So with dout zero for every t > t0, the rows of qkv at
  // t > t0 (their q, k and v) must receive exactly zero gradient.
  const int64_t B = kB, T = kT, C = kC, H = kH, C3 = 3 * C, t0 = 2;
  std::mt19937 rng(43);
  const Vec qkv = randn(rng, sz(B * T * C3));
  Vec out(sz(B * T * C)), lse(sz(B * H * T));
  ops::attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, H);
  Vec dout = randn(rng, out.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = t0 + 1; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) dout[(b * T + t) * C + c] = 0.0f;
  Vec dqkv(qkv.size(), 0.0f);
  ops::attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, C,
                          H);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = t0 + 1; t < T; ++t)
      for (int64_t c = 0; c < C3; ++c) EXPECT_EQ(dqkv[(b * T + t) * C3 + c], 0.0f);
}


// General attention (GQA, masks, strides). Inputs live in one buffer X laid out by an AttnLayout;
// its gradient buffer is pre-filled, so the check also covers accumulation and, through the
// numeric gradient of 0 there, that padding columns and masked keys receive nothing.

// q, k, v in three separate blocks of X, rows of stride ldq / ldkv (>= the head widths).
AttnLayout separate_layout(const ops::AttentionShape& s, int64_t q_pad = 0, int64_t kv_pad = 0) {
  const int64_t ldq = s.H * s.hd + q_pad, ldkv = s.Hkv * s.hd + kv_pad;
  const int64_t koff = s.B * s.Tq * ldq;
  return {0, koff, koff + s.B * s.Tk * ldkv, ldq, ldkv};
}
// Column slices q | k | v | pad of one fused buffer (self-attention: Tq == Tk).
AttnLayout fused_layout(const ops::AttentionShape& s, int64_t pad) {
  const int64_t ld = (s.H + 2 * s.Hkv) * s.hd + pad;
  return {0, s.H * s.hd, (s.H + s.Hkv) * s.hd, ld, ld};
}
int64_t layout_size(const AttnLayout& l, const ops::AttentionShape& s) {
  return std::max(
      {l.qoff + s.B * s.Tq * l.ldq, l.koff + s.B * s.Tk * l.ldkv, l.voff + s.B * s.Tk * l.ldkv});
}

void attention_fwd(float* out, float* lse, const float* X, const AttnLayout& l,
                   const ops::AttentionShape& s) {
  ops::attention_forward(out, lse, X + l.qoff, l.ldq, X + l.koff, X + l.voff, l.ldkv, s);
}
void attention_bwd(float* dX, const float* dout, const float* X, const float* out,
                   const float* lse, const AttnLayout& l, const ops::AttentionShape& s) {
  ops::attention_backward(dX + l.qoff, dX + l.koff, dX + l.voff, dout, X + l.qoff, l.ldq,
                          X + l.koff, X + l.voff, l.ldkv, out, lse, s);
}
// The same through the kernel that keeps the probabilities (the reference of the tiled one).
void attention_probs_fwd(float* out, float* probs, const float* X, const AttnLayout& l,
                         const ops::AttentionShape& s) {
  ops::attention_probs_forward(out, probs, X + l.qoff, l.ldq, X + l.koff, X + l.voff, l.ldkv, s);
}
void attention_probs_bwd(float* dX, const float* dout, const float* X, const float* probs,
                         const AttnLayout& l, const ops::AttentionShape& s) {
  ops::attention_probs_backward(dX + l.qoff, dX + l.koff, dX + l.voff, dout, X + l.qoff, l.ldq,
                                X + l.koff, X + l.voff, l.ldkv, probs, s);
}

// One row of the general attention table. key_len [B] and seg_start [B * Tq] are optional (empty).
struct AttnRow {
  std::string what;
  ops::AttentionShape s;
  std::vector<int32_t> key_len, seg_start;
  bool fused = false;  // fused q|k|v|pad layout (else separate blocks)
  int64_t pad = 0, kv_pad = 0;
};

OpCase attention_case(const AttnRow& row, uint32_t seed) {
  std::mt19937 rng(seed);
  OpCase c;
  ops::AttentionShape s = row.s;
  // The masks are inputs too: guarded, and the shape points into the guarded copies.
  if (!row.key_len.empty()) {
    c.ints.push_back(std::make_shared<GuardedI>(row.key_len));
    s.key_len = c.ints.back()->data();
  }
  if (!row.seg_start.empty()) {
    c.ints.push_back(std::make_shared<GuardedI>(row.seg_start));
    s.seg_start = c.ints.back()->data();
  }
  const AttnLayout l = row.fused ? fused_layout(s, row.pad) : separate_layout(s, row.pad, row.kv_pad);
  c.name = row.what + shape_name("", {{"B", s.B}, {"Tq", s.Tq}, {"Tk", s.Tk}, {"H", s.H},
                                      {"Hkv", s.Hkv}, {"hd", s.hd}});
  c.inputs = {{"q|k|v", randn(rng, sz(layout_size(l, s)))}};
  // NaN-filled: the forward must write every output and every row's logsumexp.
  c.outputs = {{"out", sz(s.B * s.Tq * s.H * s.hd)}, {"lse", sz(s.B * s.H * s.Tq)}};
  const auto ints = c.ints;  // keeps the masks alive as long as the calls
  c.forward = [s, l, ints](const CPtrs& in, const Ptrs& out) {
    attention_fwd(out[0], out[1], in[0], l, s);
  };
  c.reference = [s, l, ints](const std::vector<DVec>& in) {
    DVec lse;
    DVec out = gqa_attention_ref(in[0], l, s, &lse);
    return std::vector<DVec>{out, lse};
  };
  c.backward = [s, l, ints](const float* dout, const CPtrs& in, const CPtrs& saved,
                            const Ptrs& g) {
    attention_bwd(g[0], dout, in[0], saved[0], saved[1], l, s);
  };
  return c;
}

void check_attention(const AttnRow& row, uint32_t seed) {
  const CaseResult r = run_case(attention_case(row, seed), seed + 500);
  SCOPED_TRACE(row.what);
  const ops::AttentionShape& s = row.s;
  const AttnLayout l = row.fused ? fused_layout(s, row.pad) : separate_layout(s, row.pad, row.kv_pad);
  const bool has_len = !row.key_len.empty();
  // Exactly nothing into masked keys' k and v.
  const Vec &dX = r.grads[0], &pre = r.prefill[0];
  for (int64_t b = 0; has_len && b < s.B; ++b)
    for (int64_t j = row.key_len[sz(b)]; j < s.Tk; ++j)
      for (int64_t col = 0; col < s.Hkv * s.hd; ++col)
        for (int64_t off : {l.koff, l.voff}) {
          const size_t at = sz(off + (b * s.Tk + j) * l.ldkv + col);
          EXPECT_EQ(dX[at], pre[at]) << "masked key b=" << b << " j=" << j;
        }
}

TEST(KernelsAttention, GeneralCausalMhaEqualsFusedWrapper) {
  // The fused-qkv wrapper against the general function on separate contiguous q, k, v buffers.
  const int64_t B = kB, T = kT, C = kC, H = kH, C3 = 3 * C;
  std::mt19937 rng(44);
  const Vec qkv = randn(rng, sz(B * T * C3)), dout = randn(rng, sz(B * T * C));
  Vec q(sz(B * T * C)), k(q.size()), v(q.size());
  for (int64_t t = 0; t < B * T; ++t)
    for (int64_t c = 0; c < C; ++c) {
      q[sz(t * C + c)] = qkv[sz(t * C3 + c)];
      k[sz(t * C + c)] = qkv[sz(t * C3 + C + c)];
      v[sz(t * C + c)] = qkv[sz(t * C3 + 2 * C + c)];
    }
  const ops::AttentionShape s{B, T, T, H, H, C / H, true};
  Vec out0(sz(B * T * C)), lse0(sz(B * H * T)), out1(out0.size()), lse1(lse0.size());
  ops::attention_forward(out0.data(), lse0.data(), qkv.data(), B, T, C, H);
  ops::attention_forward(out1.data(), lse1.data(), q.data(), C, k.data(), v.data(), C, s);
  EXPECT_EQ(out0, out1);
  EXPECT_EQ(lse0, lse1);
  Vec dqkv(qkv.size(), 0.0f), dq(q.size(), 0.0f), dk(q.size(), 0.0f), dv(q.size(), 0.0f);
  ops::attention_backward(dqkv.data(), dout.data(), qkv.data(), out0.data(), lse0.data(), B, T, C,
                          H);
  ops::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), C, k.data(),
                          v.data(), C, out1.data(), lse1.data(), s);
  for (int64_t t = 0; t < B * T; ++t)
    for (int64_t c = 0; c < C; ++c) {
      EXPECT_EQ(dq[sz(t * C + c)], dqkv[sz(t * C3 + c)]);
      EXPECT_EQ(dk[sz(t * C + c)], dqkv[sz(t * C3 + C + c)]);
      EXPECT_EQ(dv[sz(t * C + c)], dqkv[sz(t * C3 + 2 * C + c)]);
    }
}


TEST(KernelsAttention, GroupedQueryCausal) {
  check_attention({"gqa causal", {kB, kT, kT, 4, 2, 4, true}}, 45);
  check_attention({"mqa causal", {kB, 9, 9, 4, 1, 4, true}}, 46);  // one kv head for all
}

TEST(KernelsAttention, Bidirectional) {
  check_attention({"mha bidirectional", {kB, 6, 6, 2, 2, 4, false}}, 47);
  check_attention({"gqa bidirectional", {kB, 6, 6, 4, 2, 4, false}}, 48);
}

TEST(KernelsAttention, CrossAttention) {
  check_attention({"cross", {kB, 4, 7, 4, 2, 4, false}}, 49);  // Tq != Tk
}

TEST(KernelsAttention, KeyLengthMasksPadding) {
  // batch row 0 has 4 padding keys, row 1 none
  check_attention({"cross, key_len", {kB, 4, 7, 4, 2, 4, false}, {3, 7}}, 50);
  // causal and padding together; row 1 sees key 0 only
  check_attention({"causal, key_len", {kB, 6, 6, 2, 1, 4, true}, {4, 1}}, 51);
}

// Document masks (issue 15): each query sees the keys of its own document only. Row 0 of the
// second case packs documents starting at 0, 3 and 70, so its second block of 64 query rows
// starts mid-document (the block's key range begins at its first row's document).
TEST(KernelsAttention, DocumentSegments) {
  const int64_t T = 9;
  std::vector<int32_t> seg(size_t(kB * T));
  for (int64_t t = 0; t < T; ++t) {
    seg[size_t(t)] = t < 3 ? 0 : t < 4 ? 3 : 4;  // documents [0,3), [3,4), [4,9)
    seg[size_t(T + t)] = t < 8 ? 0 : 8;          // [0,8), [8,9)
  }
  check_attention({"gqa causal, documents", {kB, T, T, 4, 2, 4, true}, {}, seg}, 56);
  const int64_t L = 72;
  std::vector<int32_t> seg2(size_t(kB * L));
  for (int64_t t = 0; t < L; ++t) {
    seg2[size_t(t)] = t < 3 ? 0 : t < 70 ? 3 : 70;
    seg2[size_t(L + t)] = t < 66 ? 0 : 66;
  }
  check_attention({"mqa causal, documents across query blocks", {kB, L, L, 2, 1, 4, true}, {},
                   seg2, true, 1},
                  57);
}

TEST(KernelsAttention, StridedColumnSlices) {
  check_attention({"fused q|k|v|pad", {kB, kT, kT, 4, 2, 4, true}, {}, {}, true, 3}, 52);
  check_attention({"separate, padded rows", {kB, 4, 6, 2, 1, 4, false}, {}, {}, false, 5, 2}, 53);
}

// Odd sizes: one query, one key, one head of width 2; primes; head widths that are not a
// multiple of the SIMD width; padding that leaves rows unaligned.
TEST(KernelsAttention, OddShapes) {
  check_attention({"single query", {1, 1, 1, 1, 1, 2, true}}, 59);
  check_attention({"cross, odd", {2, 3, 5, 3, 1, 6, false}, {5, 2}, {}, false, 7, 1}, 60);
  check_attention({"causal, long odd", {1, 17, 17, 2, 2, 2, true}, {}, {}, true, 1}, 61);
  check_attention({"gqa, hd 18 (not a multiple of 16)", {1, 5, 5, 4, 2, 18, true}, {3}, {}, false, 1, 3}, 62);
}

TEST(KernelsAttention, OneDocumentEqualsNoSegments) {
  const int64_t B = 2, T = 70, H = 2, hd = 4, C = H * hd;
  std::mt19937 rng(58);
  const Vec qkv = randn(rng, sz(B * T * 3 * C)), dout = randn(rng, sz(B * T * C));
  const std::vector<int32_t> zeros(size_t(B * T), 0);
  ops::AttentionShape plain{B, T, T, H, H, hd, true}, seg = plain;
  seg.seg_start = zeros.data();
  Vec out0(sz(B * T * C)), lse0(sz(B * H * T)), out1(out0.size()), lse1(lse0.size());
  const float *q = qkv.data(), *k = q + C, *v = q + 2 * C;
  ops::attention_forward(out0.data(), lse0.data(), q, 3 * C, k, v, 3 * C, plain);
  ops::attention_forward(out1.data(), lse1.data(), q, 3 * C, k, v, 3 * C, seg);
  EXPECT_EQ(out0, out1);
  EXPECT_EQ(lse0, lse1);
  Vec d0(qkv.size(), 0.0f), d1(qkv.size(), 0.0f);
  ops::attention_backward(d0.data(), d0.data() + C, d0.data() + 2 * C, dout.data(), q, 3 * C, k, v,
                          3 * C, out0.data(), lse0.data(), plain);
  ops::attention_backward(d1.data(), d1.data() + C, d1.data() + 2 * C, dout.data(), q, 3 * C, k, v,
                          3 * C, out1.data(), lse1.data(), seg);
  EXPECT_EQ(d0, d1);
}


TEST(KernelsAttention, GroupedBackwardIndependentOfThreadCount) {
  // dk and dv of a kv head sum over its query heads; the order must not depend on threads.
  const ops::AttentionShape s{3, 7, 7, 6, 2, 4, true};
  const AttnLayout l = fused_layout(s, 1);
  std::mt19937 rng(54);
  const Vec X = randn(rng, sz(layout_size(l, s))), dout = randn(rng, sz(s.B * s.Tq * s.H * s.hd));
  Vec out(dout.size()), lse(sz(s.B * s.H * s.Tq));
  attention_fwd(out.data(), lse.data(), X.data(), l, s);
  const int saved = omp_get_max_threads();
  std::vector<Vec> grads;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    Vec dX(X.size(), 0.5f);
    attention_bwd(dX.data(), dout.data(), X.data(), out.data(), lse.data(), l, s);
    grads.push_back(dX);
  }
  omp_set_num_threads(saved);
  EXPECT_EQ(grads[0], grads[1]);
  EXPECT_EQ(grads[0], grads[2]);
}

// The tiled kernel's blocks: small ones, so the online softmax crosses many block edges (key
// blocks that a row sees partly or not at all, rescaled accumulators) at sizes whose numeric
// gradients stay cheap.
ops::AttentionShape with_tiles(ops::AttentionShape s, int64_t queries, int64_t keys) {
  s.tiles = {queries, keys};
  return s;
}

TEST(KernelsAttention, SmallTilesCrossBlockEdges) {
  check_attention({"causal, tiles 4 x 3", with_tiles({2, 11, 11, 2, 1, 4, true}, 4, 3)}, 63);
  check_attention({"causal, key_len, tiles 3 x 5", with_tiles({2, 13, 13, 2, 2, 4, true}, 3, 5),
                   {9, 13}},
                  64);
  check_attention({"cross, key_len, tiles 2 x 3", with_tiles({2, 5, 11, 4, 2, 3, false}, 2, 3),
                   {4, 11}, {}, false, 1, 2},
                  65);
  check_attention({"bidirectional gqa, tiles 5 x 4 (one key per last block)",
                   with_tiles({1, 9, 9, 4, 2, 5, false}, 5, 4)},
                  66);
  std::vector<int32_t> seg(size_t(2 * 12));
  for (int64_t t = 0; t < 12; ++t) {
    seg[size_t(t)] = t < 5 ? 0 : t < 6 ? 5 : 6;  // documents [0,5), [5,6), [6,12)
    seg[size_t(12 + t)] = t < 9 ? 0 : 9;
  }
  check_attention({"documents, tiles 4 x 3", with_tiles({2, 12, 12, 2, 1, 4, true}, 4, 3), {},
                   seg, true, 1},
                  67);
}

// The tiled kernel against the kernel that keeps the probabilities (the model's attention before
// it): every mask kind, odd sizes (T not a multiple of either block), GQA, cross-attention and
// attention dropout, default and small blocks. Outputs and gradients agree to float rounding
// (kFwdTol normwise, as the kernels' other forward checks); the dropout rows show the backward
// draws the forward's masks again.
struct TiledRow {
  std::string what;
  ops::AttentionShape s;
  std::vector<int32_t> key_len, seg_start;
  float dropout_p = 0.0f;
};

void check_tiled_matches_probs(const TiledRow& row, uint32_t seed) {
  SCOPED_TRACE(row.what);
  ops::AttentionShape s = row.s;
  if (!row.key_len.empty()) s.key_len = row.key_len.data();
  if (!row.seg_start.empty()) s.seg_start = row.seg_start.data();
  s.dropout = {row.dropout_p, 0x1234567890abcdefull, 3, 1};
  const AttnLayout l = separate_layout(s, 1, 2);
  std::mt19937 rng(seed);
  const Vec X = randn(rng, sz(layout_size(l, s))), dout = randn(rng, sz(s.B * s.Tq * s.H * s.hd));
  Vec out(dout.size()), lse(sz(s.B * s.H * s.Tq)), out_ref(dout.size());
  Vec probs(sz(s.B * s.H * s.Tq * s.Tk));
  attention_fwd(out.data(), lse.data(), X.data(), l, s);
  attention_probs_fwd(out_ref.data(), probs.data(), X.data(), l, s);
  Vec dX(X.size(), 0.25f), dX_ref(X.size(), 0.25f);
  attention_bwd(dX.data(), dout.data(), X.data(), out.data(), lse.data(), l, s);
  attention_probs_bwd(dX_ref.data(), dout.data(), X.data(), probs.data(), l, s);
  double grad_scale = 0.0;
  for (float g : dX_ref) grad_scale = std::max(grad_scale, std::abs(double(g) - 0.25));
  ASSERT_GT(grad_scale, 1e-2) << "degenerate: the reference gradient is ~0";
  EXPECT_LE(rel_err(out, to_d(out_ref)), kFwdTol);
  EXPECT_LE(rel_err(dX, to_d(dX_ref)), kFwdTol);
  // lse against the probabilities: P = exp(S - lse) at each row's first visible key.
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t i = 0; i < s.Tq; ++i) {
        const int64_t j = s.seg_start ? s.seg_start[b * s.Tq + i] : 0;
        const int64_t g = h / (s.H / s.Hkv);
        double dotqk = 0.0;
        for (int64_t d = 0; d < s.hd; ++d)
          dotqk += double(X[sz(l.qoff + (b * s.Tq + i) * l.ldq + h * s.hd + d)]) *
                   double(X[sz(l.koff + (b * s.Tk + j) * l.ldkv + g * s.hd + d)]);
        const double p = std::exp(dotqk / std::sqrt(double(s.hd)) - lse[sz((b * s.H + h) * s.Tq + i)]);
        EXPECT_NEAR(p, probs[sz(((b * s.H + h) * s.Tq + i) * s.Tk + j)], 1e-5) << b << h << i;
      }
}

TEST(KernelsAttention, TiledMatchesProbabilitiesKernel) {
  const int64_t T = 150;  // two query blocks of 64 and a partial one; one key block of 256
  std::vector<int32_t> seg(size_t(2 * T));
  for (int64_t t = 0; t < T; ++t) {
    seg[size_t(t)] = t < 40 ? 0 : t < 100 ? 40 : 100;
    seg[size_t(T + t)] = t < 70 ? 0 : 70;
  }
  const TiledRow rows[] = {
      {"causal mha", {2, T, T, 2, 2, 16, true}},
      {"bidirectional, key_len, dropout, default tiles: one block of all 150 rows",
       {2, T, T, 2, 1, 16, false}, {97, T}, {}, 0.1f},
      {"causal gqa, small tiles", with_tiles({2, 37, 37, 4, 2, 8, true}, 8, 5)},
      {"causal, key_len", with_tiles({2, 45, 45, 2, 1, 8, true}, 16, 7), {30, 45}},
      {"bidirectional, odd", with_tiles({1, 29, 29, 3, 3, 6, false}, 9, 10)},
      {"cross, key_len", with_tiles({2, 19, 33, 4, 2, 8, false}, 6, 8), {20, 33}},
      {"documents", {2, T, T, 2, 1, 8, true}, {}, seg},
      {"documents, small tiles", with_tiles({2, T, T, 2, 1, 8, true}, 16, 24), {}, seg},
      {"causal, dropout", with_tiles({2, 41, 41, 2, 2, 8, true}, 8, 12), {}, {}, 0.3f},
      {"cross gqa, key_len, dropout", with_tiles({2, 11, 23, 4, 2, 8, false}, 4, 6), {17, 23}, {},
       0.25f},
      {"documents, dropout", {2, T, T, 2, 1, 8, true}, {}, seg, 0.2f},
  };
  uint32_t seed = 68;
  for (const TiledRow& row : rows) check_tiled_matches_probs(row, seed++);
}

// Padding query rows (query_len): the tiled kernel writes 0 and lse 0 there and its backward
// skips them. Against the kernel that computes every row, with the padding rows' dout 0 (as the
// model gives them): real rows' outputs and all gradients agree, and the padding rows of dq get
// nothing.
void check_padding_queries(const std::string& what, ops::AttentionShape s,
                           const std::vector<int32_t>& len, float dropout_p, uint32_t seed) {
  SCOPED_TRACE(what);
  s.key_len = len.data();
  s.dropout = {dropout_p, 0x5eedull, 1, 2};
  const AttnLayout l = separate_layout(s, 1, 2);
  std::mt19937 rng(seed);
  const Vec X = randn(rng, sz(layout_size(l, s)));
  Vec dout = randn(rng, sz(s.B * s.Tq * s.H * s.hd));
  const int64_t C = s.H * s.hd;
  int64_t padding = 0;
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t i = len[sz(b)]; i < s.Tq; ++i, ++padding)
      std::fill_n(dout.begin() + (b * s.Tq + i) * C, C, 0.0f);
  ASSERT_GT(padding, 0) << "no padding rows: nothing is skipped";
  Vec out_ref(dout.size()), probs(sz(s.B * s.H * s.Tq * s.Tk)), dX_ref(X.size(), 0.25f);
  attention_probs_fwd(out_ref.data(), probs.data(), X.data(), l, s);
  attention_probs_bwd(dX_ref.data(), dout.data(), X.data(), probs.data(), l, s);
  s.query_len = len.data();
  Vec out(dout.size(), 7.0f), lse(sz(s.B * s.H * s.Tq), 7.0f), dX(X.size(), 0.25f);
  attention_fwd(out.data(), lse.data(), X.data(), l, s);
  attention_bwd(dX.data(), dout.data(), X.data(), out.data(), lse.data(), l, s);
  Vec real, real_ref;
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t i = 0; i < s.Tq; ++i) {
      const bool pad = i >= len[sz(b)];
      for (int64_t c = 0; c < C; ++c) {
        const size_t e = sz((b * s.Tq + i) * C + c);
        if (pad) {
          EXPECT_EQ(out[e], 0.0f) << b << " " << i;
          EXPECT_EQ(dX[sz(l.qoff + (b * s.Tq + i) * l.ldq + c)], 0.25f) << b << " " << i;
        } else {
          real.push_back(out[e]);
          real_ref.push_back(out_ref[e]);
        }
      }
      for (int64_t h = 0; h < s.H && pad; ++h) EXPECT_EQ(lse[sz((b * s.H + h) * s.Tq + i)], 0.0f);
    }
  ASSERT_FALSE(real.empty());
  EXPECT_LE(rel_err(real, to_d(real_ref)), kFwdTol);
  EXPECT_LE(rel_err(dX, to_d(dX_ref)), kFwdTol);
}

TEST(KernelsAttention, PaddingQueryRowsAreSkipped) {
  // 70 rows: one block of all rows (bidirectional, default tiles) or 64 + 6 (causal).
  check_padding_queries("bidirectional gqa, one block", {2, 70, 70, 4, 2, 8, false}, {45, 70}, 0.0f,
                        90);
  check_padding_queries("bidirectional, dropout", {3, 70, 70, 2, 2, 8, false}, {1, 70, 66}, 0.2f,
                        91);
  check_padding_queries("causal, small tiles", with_tiles({2, 21, 21, 2, 1, 4, true}, 4, 6),
                        {13, 20}, 0.0f, 92);
}

TEST(KernelsAttention, BadShapesAreErrors) {
  Vec buf(1024, 0.0f);
  float* p = buf.data();
  const int32_t zero_len[2] = {2, 0};
  for (const ops::AttentionShape& s :
       {ops::AttentionShape{2, 3, 4, 2, 2, 4, true},   // causal with Tq != Tk
        ops::AttentionShape{2, 3, 3, 3, 2, 4, false},  // H not a multiple of Hkv
        ops::AttentionShape{2, 3, 3, 2, 2, 4, false, zero_len}}) {
    EXPECT_THROW(ops::attention_forward(p, p, p, 8, p, p, 8, s), trellis::Error);
    EXPECT_THROW(ops::attention_backward(p, p, p, p, p, 8, p, p, 8, p, p, s), trellis::Error);
    EXPECT_THROW(ops::attention_probs_forward(p, p, p, 8, p, p, 8, s), trellis::Error);
    EXPECT_THROW(ops::attention_probs_backward(p, p, p, p, p, 8, p, p, 8, p, s), trellis::Error);
  }
}


// ---------------------------------------------------------------------------------------------
// embedding

struct EmbeddingShape {
  int64_t B, T, C, V;
};

OpCase embedding_case(const EmbeddingShape& s, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> tok(0, int32_t(s.V - 1));
  std::vector<int32_t> tokens(sz(s.B * s.T));
  for (auto& t : tokens) t = tok(rng);
  if (s.B * s.T > 3 && s.V > 4)
    tokens[0] = tokens[3] = tokens[sz(s.B * s.T - 1)] = 4;  // repeated: scatter-adds collide
  OpCase c;
  c.name = shape_name("embedding", {{"B", s.B}, {"T", s.T}, {"C", s.C}, {"V", s.V}});
  c.ints.push_back(std::make_shared<GuardedI>(tokens));
  const auto toks = c.ints[0];
  c.inputs = {{"wte", randn(rng, sz(s.V * s.C))}, {"wpe", randn(rng, sz(s.T * s.C))}};
  // The whole table as one vocabulary slice, then positions: together GPT-2's embedding. A float
  // add of two floats is the correctly rounded double sum: exact comparison is fair.
  c.outputs = {{"out", sz(s.B * s.T * s.C), true}};
  c.forward = [s, toks](const CPtrs& in, const Ptrs& out) {
    ops::embedding_forward(out[0], toks->data(), in[0], 0, s.V, s.B * s.T, s.C);
    ops::position_forward(out[0], in[1], 0, s.B * s.T, s.T, s.C);
  };
  c.reference = [s, tokens](const std::vector<DVec>& in) {
    return std::vector<DVec>{embedding_ref(tokens, in[0], in[1], s.B, s.T, s.C)};
  };
  c.backward = [s, toks](const float* dout, const CPtrs&, const CPtrs&, const Ptrs& g) {
    ops::embedding_backward(g[0], dout, toks->data(), 0, s.V, s.B * s.T, s.C);
    ops::position_backward(g[1], dout, 0, s.B * s.T, s.T, s.C);
  };
  return c;
}

const EmbeddingShape kEmbeddingShapes[] = {
    {kB, kT, kC, kV}, {kB, kT, 70, kV},  // C > 32: the backward splits channels in chunks
    {1, 1, 1, 2},     {3, 7, 17, 13},    {2, 3, 33, 6}, {1, 11, 67, 5},
};

TEST(KernelsEmbedding, ForwardAndGradients) {
  uint32_t seed = 51;
  for (const EmbeddingShape& s : kEmbeddingShapes) {
    const OpCase c = embedding_case(s, seed);
    const CaseResult r = run_case(c, seed + 500);
    ++seed;
    // Rows of tokens that never occur keep exactly their pre-filled gradient.
    const std::vector<int32_t> tokens = c.ints[0]->values();
    for (int64_t v = 0; v < s.V; ++v)
      if (std::find(tokens.begin(), tokens.end(), int32_t(v)) == tokens.end()) {
        for (int64_t col = 0; col < s.C; ++col)
          EXPECT_EQ(r.grads[0][sz(v * s.C + col)], r.prefill[0][sz(v * s.C + col)]);
      }
  }
}

TEST(KernelsEmbedding, VocabularySlicesSumToTheWholeLookup) {
  // Tensor parallelism splits the table by rows; each slice looks up only its own tokens (zero
  // elsewhere), so the slices' outputs add up to the whole lookup and their gradients partition
  // the whole gradient. Positions of a row range use (row0 + i) % T.
  const int64_t n = kB * kT, C = kC, V = 12, half = V / 2;
  std::mt19937 rng(53);
  std::uniform_int_distribution<int32_t> tok(0, int32_t(V - 1));
  std::vector<int32_t> tokens(sz(n));
  for (auto& t : tokens) t = tok(rng);
  const Vec wte = randn(rng, sz(V * C)), dout = randn(rng, sz(n * C)), wpe = randn(rng, sz(kT * C));
  Vec whole(sz(n * C)), lo(sz(n * C)), hi(sz(n * C));
  ops::embedding_forward(whole.data(), tokens.data(), wte.data(), 0, V, n, C);
  ops::embedding_forward(lo.data(), tokens.data(), wte.data(), 0, half, n, C);
  ops::embedding_forward(hi.data(), tokens.data(), wte.data() + half * C, half, V - half, n, C);
  for (size_t i = 0; i < whole.size(); ++i) EXPECT_EQ(lo[i] + hi[i], whole[i]);
  Vec dwhole(sz(V * C), 0.0f), dparts(sz(V * C), 0.0f);
  ops::embedding_backward(dwhole.data(), dout.data(), tokens.data(), 0, V, n, C);
  ops::embedding_backward(dparts.data(), dout.data(), tokens.data(), 0, half, n, C);
  ops::embedding_backward(dparts.data() + half * C, dout.data(), tokens.data(), half, V - half, n,
                          C);
  for (size_t i = 0; i < dwhole.size(); ++i) EXPECT_EQ(dparts[i], dwhole[i]);
  // Rows [3, n) of the batch: row 3 + i sits at position (3 + i) % T.
  Vec pos(sz((n - 3) * C), 0.0f);
  ops::position_forward(pos.data(), wpe.data(), 3, n - 3, kT, C);
  for (int64_t i = 0; i < n - 3; ++i)
    for (int64_t c = 0; c < C; ++c) EXPECT_EQ(pos[sz(i * C + c)], wpe[sz(((3 + i) % kT) * C + c)]);
}

TEST(KernelsEmbedding, Bf16TablesReadTheirBitsWidened) {
  // bf16_embeddings' lookups against a plain loop over the bits: a vocabulary slice (tokens
  // outside it give zero rows, written over what was there), positions added to what is there,
  // by (row0 + i) % T or given; and equal to the fp32 kernels over the widened table.
  const int64_t n = kB * kT, C = kC, V = 12, start = 4, rows = 6, T = kT;
  std::mt19937 rng(71);
  std::uniform_int_distribution<int32_t> tok(0, int32_t(V - 1)), at(0, int32_t(T - 1));
  std::vector<int32_t> tokens(sz(n)), positions(sz(n));
  for (auto& t : tokens) t = tok(rng);
  for (auto& p : positions) p = at(rng);
  const Vec wte = randn(rng, sz(rows * C)), wpe = randn(rng, sz(T * C)),
            base = randn(rng, sz(n * C));
  std::vector<uint16_t> wte16(wte.size()), wpe16(wpe.size());
  for (size_t i = 0; i < wte.size(); ++i) wte16[i] = trellis::round_bf16(wte[i]);
  for (size_t i = 0; i < wpe.size(); ++i) wpe16[i] = trellis::round_bf16(wpe[i]);
  Vec wide_te(wte.size()), wide_pe(wpe.size());
  for (size_t i = 0; i < wte.size(); ++i) wide_te[i] = trellis::widen_bf16(wte16[i]);
  for (size_t i = 0; i < wpe.size(); ++i) wide_pe[i] = trellis::widen_bf16(wpe16[i]);
  ASSERT_NE(wide_te, wte) << "the table is not bf16-representable already";

  Vec got = base, fp32 = base;
  ops::embedding_forward_bf16(got.data(), tokens.data(), wte16.data(), start, rows, n, C);
  ops::embedding_forward(fp32.data(), tokens.data(), wide_te.data(), start, rows, n, C);
  int64_t inside = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = tokens[sz(i)] - start;
    inside += r >= 0 && r < rows;
    for (int64_t c = 0; c < C; ++c)
      ASSERT_EQ(got[sz(i * C + c)],
                r >= 0 && r < rows ? trellis::widen_bf16(wte16[sz(r * C + c)]) : 0.0f)
          << "row " << i << ", column " << c;
  }
  EXPECT_GT(inside, 0);
  EXPECT_LT(inside, n);
  EXPECT_EQ(got, fp32);

  for (const int32_t* pos : std::vector<const int32_t*>{nullptr, positions.data()}) {
    const int64_t row0 = 3;
    got = base, fp32 = base;
    ops::position_forward_bf16(got.data(), wpe16.data(), row0, n - row0, T, C, pos);
    ops::position_forward(fp32.data(), wide_pe.data(), row0, n - row0, T, C, pos);
    for (int64_t i = 0; i < n - row0; ++i) {
      const int64_t p = pos ? pos[row0 + i] : (row0 + i) % T;
      for (int64_t c = 0; c < C; ++c)
        ASSERT_EQ(got[sz(i * C + c)],
                  base[sz(i * C + c)] + trellis::widen_bf16(wpe16[sz(p * C + c)]))
            << (pos ? "given" : "implied") << " positions, row " << i << ", column " << c;
    }
    EXPECT_EQ(got, fp32);
  }
}

// ---------------------------------------------------------------------------------------------
// cross_entropy

struct CeData {
  Vec logits;
  std::vector<int32_t> targets;
};

CeData make_ce(int64_t BT, int64_t V, int64_t Vp, uint32_t seed, float stddev = 2.0f) {
  std::mt19937 rng(seed);
  CeData d{randn(rng, sz(BT * Vp), stddev), std::vector<int32_t>(sz(BT))};
  std::uniform_int_distribution<int32_t> tok(0, int32_t(V - 1));
  for (auto& t : d.targets) t = tok(rng);
  d.targets[0] = 0;
  if (BT > 1) d.targets[1] = int32_t(V - 1);  // the last real column
  return d;
}

// One row of the cross-entropy table: logits [BT, Vp] of which the first V columns are real,
// label smoothing e (0: the plain loss), a padding row (target -1; none if < 0), and whether the
// gradient is checked.
struct CeRow {
  int64_t BT, V, Vp;
  float stddev;
  float e;
  int64_t pad_row;
  bool grad;
};

// Losses against the double reference, their returned sum, the logits left untouched by a call
// with grad_scale 0; in gradient mode the gradient (grad_scale = 1 / real rows, the mean loss)
// against finite differences of the reference, with zero on padding columns and rows.
// cross_entropy overwrites its logits with the gradient (documented), so there is no prefill.
void check_ce(const CeRow& row, uint32_t seed) {
  const int64_t BT = row.BT, V = row.V, Vp = row.Vp;
  const float e = row.e;
  CeData d = make_ce(BT, V, Vp, seed, row.stddev);
  if (row.pad_row >= 0) d.targets[sz(row.pad_row)] = -1;
  const float grad_scale = 1.0f / float(BT - (row.pad_row >= 0 ? 1 : 0));
  auto call = [BT, V, Vp, e](float* logits, float* losses, const int32_t* targets, float scale) {
    if (e == 0.0f) return ops::cross_entropy(logits, losses, targets, BT, V, Vp, 0, scale);
    return ops::cross_entropy(logits, losses, targets, BT, V, Vp, 0, scale, {}, e, V);
  };
  auto ref_of = [BT, V, Vp, e](const DVec& logits, const std::vector<int32_t>& targets) {
    return e == 0.0f ? cross_entropy_ref(logits, targets, BT, V, Vp)
                     : smoothed_ce_ref(logits, targets, BT, V, Vp, double(e));
  };
  OpCase c;
  c.name = shape_name("cross_entropy", {{"BT", BT}, {"V", V}, {"Vp", Vp}}) +
           " stddev=" + std::to_string(row.stddev) + " e=" + std::to_string(e);
  c.ints.push_back(std::make_shared<GuardedI>(d.targets));
  const auto targets = c.ints[0];
  c.inputs = {{"logits", d.logits}};
  c.outputs = {{"losses", sz(BT)}, {"logits after grad_scale 0", sz(BT * Vp), true}};
  auto total = std::make_shared<double>(0.0);
  c.forward = [=](const CPtrs& in, const Ptrs& out) {
    std::memcpy(out[1], in[0], sz(BT * Vp) * sizeof(float));  // grad_scale 0: left untouched
    *total = call(out[1], out[0], targets->data(), 0.0f);
  };
  c.reference = [=, t = d.targets](const std::vector<DVec>& in) {
    return std::vector<DVec>{ref_of(in[0], t), in[0]};
  };
  if (row.grad) {
    // L = sum(losses * dout) with dout = grad_scale: the mean loss the kernel differentiates.
    c.dout = Vec(sz(BT), grad_scale);
    c.accumulates = false;
    c.backward = [=](const float* dout, const CPtrs& in, const CPtrs&, const Ptrs& g) {
      std::memcpy(g[0], in[0], sz(BT * Vp) * sizeof(float));
      Vec losses(sz(BT));
      call(g[0], losses.data(), targets->data(), dout[0]);
    };
  }
  const CaseResult r = run_case(c, seed + 500);
  SCOPED_TRACE(c.name);
  const Vec& losses = r.outputs[0];
  const DVec ref = ref_of(to_d(d.logits), d.targets);
  double ref_total = 0.0;
  for (double l : ref) ref_total += l;
  EXPECT_NEAR(*total, ref_total, kFwdTol * std::abs(ref_total));
  for (float l : losses) EXPECT_GE(l, 0.0f);
  if (row.pad_row >= 0) EXPECT_EQ(losses[sz(row.pad_row)], 0.0f);
  if (e > 0.0f) {
    // differs from the plain loss by far more than the tolerance (the test can fail)
    auto plain_targets = d.targets;
    if (row.pad_row >= 0) plain_targets[sz(row.pad_row)] = 0;
    EXPECT_GT(rel_err(losses, cross_entropy_ref(to_d(d.logits), plain_targets, BT, V, Vp)), 1e-2);
  }
  if (!row.grad) return;
  const Vec& g = r.grads[0];
  for (int64_t i = 0; i < BT; ++i) {
    double row_sum = 0.0;
    for (int64_t j = 0; j < Vp; ++j) {
      const float gij = g[sz(i * Vp + j)];
      if (j >= V || i == row.pad_row) EXPECT_EQ(gij, 0.0f) << "row " << i << " column " << j;
      row_sum += gij;
    }
    EXPECT_NEAR(row_sum, 0.0, 1e-7);  // softmax - (1 - e) onehot - e/V sums to zero
  }
}

TEST(KernelsCrossEntropy, LossesMatchDoubleLogSumExp) {
  // large logits (stddev 300): must be max-shifted, never overflow
  for (float stddev : {2.0f, 300.0f}) check_ce({kB * kT, kV, kVp, stddev, 0.0f, -1, false}, 61);
}

TEST(KernelsCrossEntropy, GradientMatchesFiniteDifferences) {
  const CeRow rows[] = {
      {kB * kT, kV, kVp, 2.0f, 0.0f, -1, true},
      // odd sizes: one row of two classes, primes, vocabularies past the SIMD width
      {1, 2, 2, 2.0f, 0.0f, -1, true},
      {7, 17, 17, 2.0f, 0.0f, -1, true},
      {3, 67, 80, 2.0f, 0.0f, -1, true},
      {13, 31, 32, 2.0f, 0.0f, 4, true},
  };
  uint32_t seed = 62;
  for (const CeRow& row : rows) check_ce(row, seed++);
}

TEST(KernelsCrossEntropy, PaddingColumnsNeverMatter) {
  const int64_t BT = kB * kT, V = kV, Vp = kVp;
  const CeData d = make_ce(BT, V, Vp, 63);
  auto run = [&](float pad, float grad_scale, Vec* grads) {
    Vec logits = d.logits, losses(sz(BT));
    for (int64_t i = 0; i < BT; ++i)
      for (int64_t j = V; j < Vp; ++j) logits[i * Vp + j] = pad;
    const double total = ops::cross_entropy(logits.data(), losses.data(), d.targets.data(), BT, V,
                                            Vp, 0, grad_scale);
    if (grads) *grads = logits;
    return std::make_pair(total, losses);
  };
  Vec g0;
  const auto base = run(0.0f, 0.5f, &g0);
  for (float pad :
       {1e30f, -1e30f, 88.0f, std::numeric_limits<float>::infinity(),
        -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    Vec g;
    const auto r = run(pad, 0.5f, &g);
    // Per-row losses and gradients are bitwise equal; the returned total is an OpenMP
    // reduction whose combining order is unspecified (with >= 3 threads it varies run to run in
    // the last bits), so it gets a double-rounding tolerance instead.
    EXPECT_NEAR(r.first, base.first, 1e-13 * std::abs(base.first)) << "pad=" << pad;
    EXPECT_EQ(r.second, base.second) << "pad=" << pad;
    EXPECT_EQ(g, g0) << "pad=" << pad;  // includes: padding gradient is exactly 0
  }
}


// Label smoothing: losses against the double reference, the gradient against finite differences
// of it, padding columns and padding rows out of both, e = 0 bitwise the plain loss.
TEST(KernelsCrossEntropy, LabelSmoothingMatchesReferenceAndFiniteDifferences) {
  const int64_t BT = kB * kT, V = kV, Vp = kVp;
  for (float e : {0.1f, 0.35f}) check_ce({BT, V, Vp, 2.0f, e, 3, true}, 64);
  check_ce({13, 31, 32, 2.0f, 0.2f, 5, true}, 66);  // odd sizes
  check_ce({1, 2, 2, 2.0f, 0.5f, -1, true}, 67);
  CeData d = make_ce(BT, V, Vp, 64);
  d.targets[3] = -1;  // a padding row
  // e = 0 is the plain loss, bit for bit.
  Vec a = d.logits, b = d.logits, la(sz(BT)), lb(sz(BT));
  const double ta =
      ops::cross_entropy(a.data(), la.data(), d.targets.data(), BT, V, Vp, 0, 0.25f);
  const double tb = ops::cross_entropy(b.data(), lb.data(), d.targets.data(), BT, V, Vp, 0, 0.25f,
                                       {}, 0.0f, V);
  EXPECT_EQ(ta, tb);
  EXPECT_EQ(la, lb);
  EXPECT_EQ(a, b);
}

// The vocabulary split over 2 "ranks" (threads whose combine sums or maxes their buffers, as the
// tensor-parallel all-reduce does), the second holding the last 3 real columns and 5 padding
// ones: smoothed losses and gradients equal the whole-vocabulary kernel's.
TEST(KernelsCrossEntropy, LabelSmoothingUnderVocabularySplit) {
  const int64_t BT = kB * kT, V = kV, Vp = kVp, L = Vp / 2;
  CeData d = make_ce(BT, V, Vp, 65);
  d.targets[2] = -1;
  d.targets[4] = int32_t(L + 1);  // a target in the second slice
  const float e = 0.2f, grad_scale = 0.125f;
  Vec whole = d.logits, whole_losses(sz(BT));
  const double whole_total = ops::cross_entropy(whole.data(), whole_losses.data(),
                                                d.targets.data(), BT, V, Vp, 0, grad_scale, {},
                                                e, V);
  Vec part[2], part_losses[2];
  double part_total[2] = {};
  int combines[2] = {};
  std::vector<double>* slot[2] = {};
  std::barrier sync(2);
  auto rank = [&](int r) {
    omp_set_num_threads(1);
    part[r].resize(sz(BT * L));
    part_losses[r].resize(sz(BT));
    for (int64_t i = 0; i < BT; ++i)
      for (int64_t j = 0; j < L; ++j) part[r][sz(i * L + j)] = d.logits[sz(i * Vp + r * L + j)];
    const int64_t valid = std::clamp<int64_t>(V - r * L, 0, L);
    const ops::RowCombine combine = [&, r](double* buf, int64_t n, bool is_max) {
      ++combines[r];
      std::vector<double> mine(buf, buf + n);
      slot[r] = &mine;
      sync.arrive_and_wait();
      const std::vector<double>& other = *slot[1 - r];
      EXPECT_EQ(other.size(), mine.size());
      for (int64_t k = 0; k < n; ++k)
        buf[k] = is_max ? std::max(mine[sz(k)], other[sz(k)]) : mine[sz(k)] + other[sz(k)];
      sync.arrive_and_wait();  // both read before either buffer goes
    };
    part_total[r] = ops::cross_entropy(part[r].data(), part_losses[r].data(), d.targets.data(),
                                       BT, valid, L, r * L, grad_scale, combine, e, V);
  };
  std::thread t1(rank, 1);
  rank(0);
  t1.join();
  EXPECT_EQ(combines[0], 2);  // the max, then one sum (the logit sums ride with the others)
  EXPECT_EQ(combines[1], 2);
  DVec ref_losses(whole_losses.begin(), whole_losses.end());
  for (int r = 0; r < 2; ++r) {
    EXPECT_LE(rel_err(part_losses[r], ref_losses), 1e-6) << "rank " << r;
    EXPECT_NEAR(part_total[r], whole_total, 1e-6 * std::abs(whole_total));
  }
  DVec joined(sz(BT * Vp)), ref(whole.begin(), whole.end());
  for (int64_t i = 0; i < BT; ++i)
    for (int r = 0; r < 2; ++r)
      for (int64_t j = 0; j < L; ++j) joined[sz(i * Vp + r * L + j)] = part[r][sz(i * L + j)];
  EXPECT_LE(rel_err(joined, ref), 1e-6);
}


// A bf16 model's logits (its LM head output, kept in bf16 as autocast keeps it): cross_entropy_bf16
// is the fp32 kernel on the widened values, its gradient rounded once into the row (the bits
// ops::to_bf16 gives the fp32 gradient): losses and total bitwise, gradient bits equal, padding
// columns (NaN here) never read and zeroed, a padding row zero, logits untouched at grad_scale 0;
// plain and smoothed, the whole vocabulary and a tensor-parallel slice (vocab_start, a combine).
TEST(KernelsCrossEntropy, Bf16LogitsAreTheFp32KernelOnWidenedValues) {
  const int64_t BT = 13, Vp = 80;
  struct Slice {
    int64_t valid, start, vocab;
  };
  for (float e : {0.0f, 0.2f})
    for (const Slice sl : {Slice{67, 0, 67}, Slice{51, 40, 91}}) {
      SCOPED_TRACE("e=" + std::to_string(e) + " start=" + std::to_string(sl.start));
      CeData d = make_ce(BT, sl.valid, Vp, 68, 3.0f);
      d.targets[5] = -1;                          // a padding row
      d.targets[6] = int32_t(sl.start + 2);       // a target inside this slice
      d.targets[7] = int32_t(sl.start > 0 ? 1 : sl.valid - 1);  // outside it, where there is one
      std::vector<uint16_t> bits(sz(BT * Vp));
      ops::to_bf16(bits.data(), d.logits.data(), BT * Vp);
      Vec widened(sz(BT * Vp));
      ops::from_bf16(widened.data(), bits.data(), BT * Vp);
      for (int64_t i = 0; i < BT; ++i)
        for (int64_t j = sl.valid; j < Vp; ++j) bits[sz(i * Vp + j)] = 0x7fc1;  // NaN padding
      int combines = 0;
      const ops::RowCombine combine = [&](double*, int64_t, bool) { ++combines; };
      const ops::RowCombine none = {};
      const ops::RowCombine& c = sl.start > 0 ? combine : none;
      for (float grad_scale : {0.0f, 0.125f}) {
        Vec f = widened, lf(sz(BT)), lb(sz(BT));
        std::vector<uint16_t> b = bits;
        const double tf = ops::cross_entropy(f.data(), lf.data(), d.targets.data(), BT, sl.valid,
                                             Vp, sl.start, grad_scale, c, e, sl.vocab);
        const double tb = ops::cross_entropy_bf16(b.data(), lb.data(), d.targets.data(), BT,
                                                  sl.valid, Vp, sl.start, grad_scale, c, e,
                                                  sl.vocab);
        EXPECT_EQ(tf, tb);
        EXPECT_EQ(lf, lb);
        EXPECT_EQ(lb[5], 0.0f);
        if (grad_scale == 0.0f) {
          EXPECT_EQ(b, bits);  // untouched, padding included
          continue;
        }
        std::vector<uint16_t> want(sz(BT * Vp));
        ops::to_bf16(want.data(), f.data(), BT * Vp);
        EXPECT_EQ(b, want);
        for (int64_t j = 0; j < Vp; ++j) EXPECT_EQ(b[sz(5 * Vp + j)], 0u) << "padding row";
        for (int64_t j = sl.valid; j < Vp; ++j) EXPECT_EQ(b[sz(Vp + j)], 0u) << "padding column";
      }
      EXPECT_EQ(combines, sl.start > 0 ? 8 : 0);  // a max and a sum per call, 4 calls
    }
}


// ---------------------------------------------------------------------------------------------
// accumulate / scale / add_bias / sum_squares

// Each is a single correctly rounded float operation per element: exact comparison against the
// same expression evaluated in a plain loop, on guarded buffers.
TEST(KernelsPointwise, AccumulateScaleAddBias) {
  std::mt19937 rng(71);
  for (int64_t n : {int64_t(1003) /* odd: SIMD tails */, int64_t(1), int64_t(15), int64_t(16),
                    int64_t(17), int64_t(67)}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const Vec a = randn(rng, sz(n)), b = randn(rng, sz(n));
    GuardedF y(a), x_in(b);
    ops::accumulate(y.data(), x_in.data(), n);
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(y.data()[i], a[sz(i)] + b[sz(i)]);
    ops::accumulate(y.data(), x_in.data(), n);
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(y.data()[i], (a[sz(i)] + b[sz(i)]) + b[sz(i)]);
    y.intact("accumulate: y");
    x_in.intact("accumulate: x");
    EXPECT_TRUE(same_bits(x_in.values(), b)) << "accumulate wrote into x";

    GuardedF x(a);
    ops::scale(x.data(), -0.37f, n);
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(x.data()[i], a[sz(i)] * -0.37f);
    ops::scale(x.data(), 0.0f, n);
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(x.data()[i], 0.0f);
    x.intact("scale");
  }

  // add_bias: rows of a [rows, C] block get the bias (and a residual) added: y += bias + r.
  for (const RowsCols& s : {RowsCols{17, 59}, RowsCols{1, 1}, RowsCols{3, 16}, RowsCols{2, 33}}) {
    const int64_t rows = s.rows, C = s.C;
    SCOPED_TRACE("add_bias rows=" + std::to_string(rows) + " C=" + std::to_string(C));
    const Vec bias = randn(rng, sz(C)), r = randn(rng, sz(rows * C)), y0 = randn(rng, sz(rows * C));
    GuardedF with_res(y0), no_res(y0), gbias(bias), gr(r);
    ops::add_bias(with_res.data(), gbias.data(), gr.data(), rows, C);
    ops::add_bias(no_res.data(), gbias.data(), nullptr, rows, C);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t c = 0; c < C; ++c) {
        const size_t k = sz(i * C + c);
        EXPECT_EQ(with_res.data()[k], y0[k] + (bias[sz(c)] + r[k]));
        EXPECT_EQ(no_res.data()[k], y0[k] + (bias[sz(c)] + 0.0f));
      }
    with_res.intact("add_bias: out");
    no_res.intact("add_bias: out (no residual)");
    gbias.intact("add_bias: bias");
    gr.intact("add_bias: residual");
    EXPECT_TRUE(same_bits(gbias.values(), bias) && same_bits(gr.values(), r))
        << "add_bias wrote into its bias or residual";
  }

  // n = 0 is a no-op.
  ops::accumulate(nullptr, nullptr, 0);
  ops::scale(nullptr, 2.0f, 0);
  EXPECT_EQ(ops::sum_squares(nullptr, 0), 0.0);
}

TEST(KernelsPointwise, SumSquaresInDouble) {
  std::mt19937 rng(72);
  for (int64_t n : {int64_t(1003), int64_t(2), int64_t(17), int64_t(64)}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    Vec v = randn(rng, sz(n));
    v[0] = 1e20f;  // squares overflow float but not double
    v[1] = 1e-3f;
    GuardedF x(v);
    double ref = 0.0;
    for (float e : v) ref += double(e) * double(e);
    // Float*float is exact in double; only the (reordered) double sum rounds: ~n * 1e-16.
    EXPECT_NEAR(ops::sum_squares(x.data(), n), ref, 1e-12 * ref);
    x.data()[0] = v[0] = 3.0f;
    ref = 0.0;
    for (float e : v) ref += double(e) * double(e);
    EXPECT_NEAR(ops::sum_squares(x.data(), n), ref, 1e-12 * ref);
    x.intact("sum_squares");
    EXPECT_TRUE(same_bits(x.values(), v)) << "sum_squares wrote into its input";
  }
  const float three[3] = {1.0f, -2.0f, 2.0f};
  EXPECT_EQ(ops::sum_squares(three, 3), 9.0);
}

}  // namespace
