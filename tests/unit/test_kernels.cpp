// kernels/: every op in trellis/kernels/ops.h against plain-loop double-precision references.
//
// Method, per op with a backward:
//   * The float forward must match the double reference forward (evaluated at the same, float-
//     representable inputs) to kFwdTol, normwise: max|f - d| / max|d|.
//   * L = sum(out * R) for a fixed random R. The kernel's backward gets dout = R; its float
//     gradients are compared with central differences of the *double* reference L, normwise:
//     max|analytic - numeric| / max|numeric| <= kGradTol.
//   * Gradient buffers are pre-filled with a random pattern P before backward, and the check uses
//     (grad - P): the backward must accumulate (+=), not overwrite.
// Shapes are tiny (B=2, T=5, C=8, H=2, V=11, Vp=16) plus a few wider ones that cross the kernels'
// column-chunk boundaries (32 / 64), so the whole file runs in well under a second.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <barrier>
#include <cfloat>
#include <cmath>
#include <complex>
#include <cstdint>
#include <functional>
#include <limits>
#include <numbers>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "trellis/core/error.h"
#include "trellis/kernels/ops.h"

namespace {

using Vec = std::vector<float>;
using DVec = std::vector<double>;
namespace ops = trellis::ops;

// Float forward vs double reference, normwise. The a-priori error of a float sum of K terms is
// <= K * u * sum|terms| (u = 6e-8); with K <= 130 and O(1) random data that is on the order of
// 1e-5 of the output scale, while the measured errors (random rounding signs) are <= 3.5e-7 for
// every op. A real bug (wrong index, missing term, wrong scale) gives O(1e-2..1).
constexpr double kFwdTol = 1e-5;

// Analytic (float) vs numeric (double) gradients, normwise. The numeric side is accurate to
// ~1e-10 relative: central differences with h = 1e-5 of a double function have truncation error
// ~h^2 |f'''| / 6 and roundoff ~1e-16 |L| / h, both ~1e-10. So the float analytic gradient sets
// the error: the same K * u argument as for the forward (backward sums have at most ~130 terms;
// the LayerNorm/softmax backward subtractions are of O(1) terms, no catastrophic cancellation
// at these inputs). Measured: <= 4.1e-7 across all ops, so 1e-5 (~25x head-room) is justified;
// the common 1e-4 would be looser than float needs here.
constexpr double kGradTol = 1e-5;
constexpr double kFdStep = 1e-5;

constexpr int64_t kB = 2, kT = 5, kC = 8, kH = 2, kV = 11, kVp = 16;

// Element count (a named function, unlike size_t(n), never parses as a declaration).
size_t sz(int64_t n) { return static_cast<size_t>(n); }

Vec randn(std::mt19937& rng, size_t n, float stddev = 1.0f) {
  std::normal_distribution<float> d(0.0f, stddev);
  Vec v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

DVec to_d(const Vec& v) { return DVec(v.begin(), v.end()); }

// max|a - b| / max|b|: normwise relative error of a against reference b; infinite when a holds
// a NaN/inf (std::max alone would silently skip NaNs).
double rel_err(const DVec& a, const DVec& b) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num = std::max(num, std::abs(a[i] - b[i]));
    den = std::max(den, std::abs(b[i]));
  }
  return den > 0.0 ? num / den : num;
}
double rel_err(const Vec& a, const DVec& b) { return rel_err(to_d(a), b); }

double dot(const DVec& a, const DVec& r) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * r[i];
  return s;
}

// Central differences of the double-precision scalar function f around x.
DVec numeric_grad(const std::function<double(const DVec&)>& f, DVec x) {
  DVec g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double xi = x[i];
    x[i] = xi + kFdStep;
    const double fp = f(x);
    x[i] = xi - kFdStep;
    const double fm = f(x);
    x[i] = xi;
    g[i] = (fp - fm) / (2.0 * kFdStep);
  }
  return g;
}

// grad came out of a backward that started from `prefill`; what it added must match the numeric
// gradient of loss_of at x. The subtraction is done in double (exact for two floats).
void expect_grad(const std::string& what, const Vec& x, const Vec& grad, const Vec& prefill,
                 const std::function<double(const DVec&)>& loss_of) {
  ASSERT_EQ(grad.size(), x.size()) << what;
  ASSERT_EQ(prefill.size(), x.size()) << what;
  DVec added(x.size());
  for (size_t i = 0; i < x.size(); ++i) added[i] = double(grad[i]) - double(prefill[i]);
  const DVec num = numeric_grad(loss_of, to_d(x));
  double mx = 0.0;
  for (double v : num) mx = std::max(mx, std::abs(v));
  EXPECT_GT(mx, 1e-3) << what << ": degenerate test, numeric gradient is ~0";
  EXPECT_LE(rel_err(added, num), kGradTol) << what;
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
                   DVec* probs = nullptr) {
  const int64_t hs = C / H, C3 = 3 * C;
  DVec out(sz(B * T * C), 0.0);
  if (probs) probs->assign(sz(B * H * T * T), 0.0);
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
        for (int64_t j = 0; j <= i; ++j) {
          p[j] /= sum;
          if (probs) (*probs)[((b * H + h) * T + i) * T + j] = p[j];
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

// Per-row cross-entropy over the first V of Vp columns, log-sum-exp in double.
DVec cross_entropy_ref(const DVec& logits, const std::vector<int32_t>& targets, int64_t BT,
                       int64_t V, int64_t Vp) {
  DVec losses(sz(BT));
  for (int64_t i = 0; i < BT; ++i) {
    const double* row = &logits[i * Vp];
    double mx = row[0];
    for (int64_t j = 1; j < V; ++j) mx = std::max(mx, row[j]);
    double sum = 0.0;
    for (int64_t j = 0; j < V; ++j) sum += std::exp(row[j] - mx);
    losses[i] = mx + std::log(sum) - row[targets[i]];
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
                       DVec* probs = nullptr) {
  const int64_t hd = s.hd, C = s.H * hd;
  DVec out(sz(s.B * s.Tq * C), 0.0);
  if (probs) probs->assign(sz(s.B * s.H * s.Tq * s.Tk), 0.0);
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
        for (int64_t j = 0; j < s.Tk; ++j) {
          if (!visible(j)) continue;
          const double pj = p[j] / sum;
          if (probs) (*probs)[sz(((b * s.H + h) * s.Tq + i) * s.Tk + j)] = pj;
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
// its double reference. run() calls ops::gemm on a fresh copy of C and checks each element
// against the classic error bound |c - c_ref| <= gamma * (|alpha| sum_k |a_ik b_kj| + |beta c_ij|),
// gamma = (K+2) u, doubled for slack (any summation order, FMA or not, satisfies it), and that the
// padding of C was not written; it returns C (with padding).
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

  Vec run() const {
    Vec C = C0;
    ops::gemm(s.ta, s.tb, s.M, s.N, s.K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
    const double gamma = 2.0 * double(s.K + 2) * (FLT_EPSILON / 2);
    // Every element is checked; the first failures are reported one by one, the rest counted.
    int64_t bad = 0, bad_pad = 0;
    for (int64_t i = 0; i < s.M; ++i) {
      for (int64_t j = 0; j < s.N; ++j) {
        const size_t at = sz(i * ldc + j);
        const bool ok = std::abs(C[at] - ref[at]) <= gamma * bound[at] + 1e-30;
        if (!ok && ++bad <= 3)
          EXPECT_LE(std::abs(C[at] - ref[at]), gamma * bound[at] + 1e-30)
              << "ta=" << s.ta << " tb=" << s.tb << " M=" << s.M << " N=" << s.N << " K=" << s.K
              << " at (" << i << "," << j << ")";
      }
      for (int64_t j = s.N; j < ldc; ++j)
        if (C[sz(i * ldc + j)] != kSentinel && ++bad_pad <= 3)
          EXPECT_EQ(C[sz(i * ldc + j)], kSentinel) << "gemm wrote into the ldc padding";
    }
    EXPECT_EQ(bad, 0) << "elements beyond the error bound, of " << s.M * s.N;
    EXPECT_EQ(bad_pad, 0) << "padding elements written";
    return C;
  }
};

void check_gemm(const GemmShape& s, float alpha, float beta, uint32_t seed) {
  GemmCase(s, alpha, beta, seed).run();
}

TEST(KernelsGemm, AllTransposeCombosMatchDoubleReference) {
  uint32_t seed = 1;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      // beta = 0 (plain product), and beta != 0 (accumulate into C), with alpha != 1.
      check_gemm({ta, tb, 5, 7, 6}, 1.0f, 0.0f, seed++);
      check_gemm({ta, tb, 5, 7, 6}, 0.75f, 1.0f, seed++);
      check_gemm({ta, tb, 5, 7, 6}, -1.5f, 0.5f, seed++);
      // Larger, odd sizes: exercise the backend's blocking and tails.
      check_gemm({ta, tb, 33, 17, 70}, 1.0f, 1.0f, seed++);
    }
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
  // this oneDNN: the results must equal the 1-thread one exactly. The docs promise less
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
          if (alpha == 1.0f)
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

void check_linear(int64_t BT, int64_t IC, int64_t OC, bool with_bias, uint32_t seed) {
  SCOPED_TRACE("linear BT=" + std::to_string(BT) + " IC=" + std::to_string(IC) +
               " OC=" + std::to_string(OC) + " bias=" + std::to_string(with_bias));
  std::mt19937 rng(seed);
  const Vec inp = randn(rng, sz(BT * IC)), w = randn(rng, sz(IC * OC), 0.5f);
  const Vec bias = randn(rng, sz(OC)), R = randn(rng, sz(BT * OC));
  const DVec dinp_ = to_d(inp), dw_ = to_d(w), db_ = to_d(bias), dR = to_d(R);

  // Without bias, out starts as NaN: the forward must overwrite, not accumulate.
  Vec out(sz(BT * OC), std::numeric_limits<float>::quiet_NaN());
  ops::linear_forward(out.data(), inp.data(), w.data(), with_bias ? bias.data() : nullptr, BT, IC,
                      OC);
  EXPECT_LE(rel_err(out, linear_ref(dinp_, dw_, with_bias ? &db_ : nullptr, BT, IC, OC)), kFwdTol);

  const Vec pre_inp = randn(rng, inp.size()), pre_w = randn(rng, w.size());
  const Vec pre_b = randn(rng, bias.size());
  Vec dinp = pre_inp, dw = pre_w, dbias = pre_b;
  ops::linear_backward(dinp.data(), dw.data(), with_bias ? dbias.data() : nullptr, R.data(),
                       inp.data(), w.data(), BT, IC, OC);
  auto L = [&](const DVec& x, const DVec& ww, const DVec& bb) {
    return dot(linear_ref(x, ww, with_bias ? &bb : nullptr, BT, IC, OC), dR);
  };
  expect_grad("dinp", inp, dinp, pre_inp, [&](const DVec& v) { return L(v, dw_, db_); });
  expect_grad("dw", w, dw, pre_w, [&](const DVec& v) { return L(dinp_, v, db_); });
  if (with_bias)
    expect_grad("dbias", bias, dbias, pre_b, [&](const DVec& v) { return L(dinp_, dw_, v); });
  else
    EXPECT_EQ(dbias, pre_b);
}

TEST(KernelsLinear, ForwardAndGradients) {
  check_linear(kB * kT, kC, 3 * kC, true, 11);
  check_linear(kB * kT, kC, 3 * kC, false, 12);
  check_linear(kB * kT, 4 * kC, kC, true, 13);
  check_linear(3, 5, 130, true, 14);  // OC > 64: dbias is split in column chunks
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

void check_layernorm(int64_t BT, int64_t C, uint32_t seed) {
  SCOPED_TRACE("layernorm BT=" + std::to_string(BT) + " C=" + std::to_string(C));
  std::mt19937 rng(seed);
  Vec inp = randn(rng, sz(BT * C), 2.0f);
  // Row 0: tiny spread (variance ~4e-6 < eps), so eps visibly matters. Other rows: offsets, so
  // the mean must really be removed.
  for (int64_t c = 0; c < C; ++c) inp[c] *= 1e-3f;
  for (int64_t i = 1; i < BT; ++i)
    for (int64_t c = 0; c < C; ++c) inp[i * C + c] += float(i) - 1.5f;
  Vec weight = randn(rng, sz(C), 0.5f), bias = randn(rng, sz(C), 0.5f);
  for (auto& w : weight) w += 1.0f;
  const Vec R = randn(rng, sz(BT * C));
  const float eps = 1e-5f;
  const DVec dx = to_d(inp), dw = to_d(weight), db = to_d(bias), dR = to_d(R);

  Vec out(sz(BT * C)), mean(sz(BT)), rstd(sz(BT));
  ops::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(),
                         bias.data(), BT, C, eps);
  DVec rmean(sz(BT)), rrstd(sz(BT));
  const DVec ref = layernorm_ref(dx, dw, db, BT, C, eps, &rmean, &rrstd);
  EXPECT_LE(rel_err(out, ref), kFwdTol);
  EXPECT_LE(rel_err(mean, rmean), kFwdTol);
  EXPECT_LE(rel_err(rstd, rrstd), kFwdTol);

  const Vec pre_x = randn(rng, inp.size()), pre_w = randn(rng, weight.size());
  const Vec pre_b = randn(rng, bias.size());
  Vec dinp = pre_x, dweight = pre_w, dbias = pre_b;
  ops::layernorm_backward(dinp.data(), dweight.data(), dbias.data(), R.data(), inp.data(),
                          weight.data(), mean.data(), rstd.data(), BT, C);
  auto L = [&](const DVec& x, const DVec& w, const DVec& b) {
    return dot(layernorm_ref(x, w, b, BT, C, eps), dR);
  };
  expect_grad("dinp", inp, dinp, pre_x, [&](const DVec& v) { return L(v, dw, db); });
  expect_grad("dweight", weight, dweight, pre_w, [&](const DVec& v) { return L(dx, v, db); });
  expect_grad("dbias", bias, dbias, pre_b, [&](const DVec& v) { return L(dx, dw, v); });
}

TEST(KernelsLayerNorm, ForwardAndGradients) {
  check_layernorm(kB * kT, kC, 21);
  check_layernorm(3, 130, 22);  // C > 64: dweight/dbias are split in column chunks
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

void check_rmsnorm(int64_t rows, int64_t C, uint32_t seed) {
  SCOPED_TRACE("rmsnorm rows=" + std::to_string(rows) + " C=" + std::to_string(C));
  std::mt19937 rng(seed);
  Vec inp = randn(rng, sz(rows * C), 2.0f);
  // Row 0: tiny values (mean square ~4e-6 < eps), so eps visibly matters. Other rows: offsets,
  // which RMSNorm (unlike LayerNorm) keeps.
  for (int64_t c = 0; c < C; ++c) inp[c] *= 1e-3f;
  for (int64_t i = 1; i < rows; ++i)
    for (int64_t c = 0; c < C; ++c) inp[i * C + c] += float(i) - 1.5f;
  Vec weight = randn(rng, sz(C), 0.5f);
  for (auto& w : weight) w += 1.0f;
  const Vec R = randn(rng, sz(rows * C));
  const float eps = 1e-5f;
  const DVec dx = to_d(inp), dw = to_d(weight), dR = to_d(R);

  Vec out(sz(rows * C), std::numeric_limits<float>::quiet_NaN()), rstd(sz(rows));
  ops::rmsnorm_forward(out.data(), rstd.data(), inp.data(), weight.data(), rows, C, eps);
  DVec rrstd(sz(rows));
  EXPECT_LE(rel_err(out, rmsnorm_ref(dx, dw, rows, C, eps, &rrstd)), kFwdTol);
  EXPECT_LE(rel_err(rstd, rrstd), kFwdTol);

  const Vec pre_x = randn(rng, inp.size()), pre_w = randn(rng, weight.size());
  Vec dinp = pre_x, dweight = pre_w;
  ops::rmsnorm_backward(dinp.data(), dweight.data(), R.data(), inp.data(), weight.data(),
                        rstd.data(), rows, C);
  expect_grad("dinp", inp, dinp, pre_x,
              [&](const DVec& v) { return dot(rmsnorm_ref(v, dw, rows, C, eps), dR); });
  expect_grad("dweight", weight, dweight, pre_w,
              [&](const DVec& v) { return dot(rmsnorm_ref(dx, v, rows, C, eps), dR); });
}

TEST(KernelsRmsNorm, ForwardAndGradients) {
  check_rmsnorm(kB * kT, kC, 24);
  check_rmsnorm(3, 130, 25);  // C > 64: dweight is split in column chunks
}

// ---------------------------------------------------------------------------------------------
// rope

// rows rows of stride ld (wider than the heads: the extra columns must pass through untouched),
// starting at row0 of a [B*T] batch.
void check_rope(int64_t rows, int64_t row0, int64_t T, int64_t n_heads, int64_t hd, float theta,
                uint32_t seed) {
  SCOPED_TRACE("rope rows=" + std::to_string(rows) + " row0=" + std::to_string(row0) +
               " T=" + std::to_string(T) + " hd=" + std::to_string(hd));
  std::mt19937 rng(seed);
  const int64_t ld = n_heads * hd + 3;
  const Vec x = randn(rng, sz(rows * ld)), R = randn(rng, sz(rows * ld));
  const DVec dR = to_d(R);
  Vec y = x;
  ops::rope_forward(y.data(), ld, rows, row0, T, n_heads, hd, theta);
  EXPECT_LE(rel_err(y, rope_ref(to_d(x), ld, rows, row0, T, n_heads, hd, theta)), kFwdTol);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = n_heads * hd; c < ld; ++c) EXPECT_EQ(y[sz(r * ld + c)], x[sz(r * ld + c)]);

  // rope_backward maps dout to dinp in place (no accumulation: there is nothing to add to).
  Vec dx = R;
  ops::rope_backward(dx.data(), ld, rows, row0, T, n_heads, hd, theta);
  expect_grad("dx", x, dx, Vec(x.size(), 0.0f), [&](const DVec& v) {
    return dot(rope_ref(v, ld, rows, row0, T, n_heads, hd, theta), dR);
  });
}

TEST(KernelsRope, ForwardMatchesClosedFormAndGradient) {
  check_rope(kB * kT, 0, kT, 2, 8, 10000.0f, 26);
  check_rope(7, 3, 4, 3, 6, 10000.0f, 27);          // row0 != 0, T < rows: positions wrap
  check_rope(5, 1000, 1024, 1, 16, 500000.0f, 28);  // large angles: computed in double
}

TEST(KernelsRope, OddHeadWidthIsAnError) {
  Vec x(12, 1.0f);
  EXPECT_THROW(ops::rope_forward(x.data(), 6, 2, 0, 2, 2, 3, 10000.0f), trellis::Error);
}

// ---------------------------------------------------------------------------------------------
// gelu

TEST(KernelsGelu, ForwardAndGradient) {
  std::mt19937 rng(31);
  const int64_t n = 203;  // odd: SIMD tails
  Vec x = randn(rng, sz(n), 2.0f);
  x[0] = 0.0f, x[1] = -6.0f, x[2] = 6.0f, x[3] = -0.5f, x[4] = 3.0f;
  const Vec R = randn(rng, sz(n));
  const DVec dx = to_d(x), dR = to_d(R);
  Vec out(sz(n));
  ops::gelu_forward(out.data(), x.data(), n);
  EXPECT_LE(rel_err(out, gelu_ref(dx)), kFwdTol);
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_NEAR(out[2], 6.0f, 1e-5f);  // ~identity for large positive x
  EXPECT_NEAR(out[1], 0.0f, 1e-5f);  // ~0 for large negative x

  const Vec pre = randn(rng, sz(n));
  Vec dinp = pre;
  ops::gelu_backward(dinp.data(), x.data(), R.data(), n);
  expect_grad("dinp", x, dinp, pre, [&](const DVec& v) { return dot(gelu_ref(v), dR); });
}

TEST(KernelsGelu, BiasFusedIntoForwardEqualsBiasThenGelu) {
  std::mt19937 rng(32);
  const int64_t rows = 5, C = 19;  // C odd: per-row SIMD tails
  const Vec x = randn(rng, sz(rows * C), 2.0f), bias = randn(rng, sz(C));
  Vec want_in = x, want_out(x.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < C; ++c) want_in[sz(r * C + c)] += bias[sz(c)];
  ops::gelu_forward(want_out.data(), want_in.data(), rows * C);
  Vec in = x, out(x.size(), std::numeric_limits<float>::quiet_NaN());
  ops::gelu_bias_forward(out.data(), in.data(), bias.data(), rows, C);
  EXPECT_EQ(in, want_in);  // the pre-activation is kept for gelu_backward
  EXPECT_EQ(out, want_out);
}

// ---------------------------------------------------------------------------------------------
// swiglu

TEST(KernelsSwiGlu, ForwardAndGradient) {
  std::mt19937 rng(32);
  const int64_t rows = 3, F = 11;  // odd: SIMD tails
  Vec gu = randn(rng, sz(rows * 2 * F), 2.0f);
  gu[0] = 0.0f, gu[1] = -30.0f, gu[2] = 30.0f, gu[3] = -800.0f;  // exp(800) overflows: silu = 0
  const Vec R = randn(rng, sz(rows * F));
  const DVec dgu_ = to_d(gu), dR = to_d(R);
  Vec out(sz(rows * F), std::numeric_limits<float>::quiet_NaN());
  ops::swiglu_forward(out.data(), gu.data(), rows, F);
  EXPECT_LE(rel_err(out, swiglu_ref(dgu_, rows, F)), kFwdTol);
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[3], 0.0f);

  const Vec pre = randn(rng, gu.size());
  Vec dgu = pre;
  ops::swiglu_backward(dgu.data(), gu.data(), R.data(), rows, F);
  expect_grad("dgu", gu, dgu, pre, [&](const DVec& v) { return dot(swiglu_ref(v, rows, F), dR); });
}

// ---------------------------------------------------------------------------------------------
// attention

TEST(KernelsAttention, ForwardProbsAndGradients) {
  const int64_t B = kB, T = kT, C = kC, H = kH;
  std::mt19937 rng(41);
  const Vec qkv = randn(rng, sz(B * T * 3 * C));
  const Vec R = randn(rng, sz(B * T * C));
  const DVec dqkv_ = to_d(qkv), dR = to_d(R);

  Vec out(sz(B * T * C), std::numeric_limits<float>::quiet_NaN());
  Vec probs(sz(B * H * T * T), std::numeric_limits<float>::quiet_NaN());
  ops::attention_forward(out.data(), probs.data(), qkv.data(), B, T, C, H);
  DVec rprobs;
  EXPECT_LE(rel_err(out, attention_ref(dqkv_, B, T, C, H, &rprobs)), kFwdTol);
  EXPECT_LE(rel_err(probs, rprobs), kFwdTol);
  // Causal probabilities: rows sum to 1, exactly zero above the diagonal.
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t i = 0; i < T; ++i) {
      double s = 0.0;
      for (int64_t j = 0; j < T; ++j) {
        const float p = probs[(bh * T + i) * T + j];
        if (j > i) {
          EXPECT_EQ(p, 0.0f);
        }
        s += p;
      }
      EXPECT_NEAR(s, 1.0, 1e-6);
    }

  const Vec pre = randn(rng, qkv.size());
  Vec dqkv = pre;
  ops::attention_backward(dqkv.data(), R.data(), qkv.data(), probs.data(), B, T, C, H);
  expect_grad("dqkv", qkv, dqkv, pre,
              [&](const DVec& v) { return dot(attention_ref(v, B, T, C, H), dR); });
}

TEST(KernelsAttention, FutureTokensDoNotChangeEarlierOutputs) {
  const int64_t B = kB, T = kT, C = kC, H = kH, C3 = 3 * C;
  std::mt19937 rng(42);
  const Vec qkv = randn(rng, sz(B * T * C3));
  Vec out0(sz(B * T * C)), probs0(sz(B * H * T * T));
  ops::attention_forward(out0.data(), probs0.data(), qkv.data(), B, T, C, H);
  for (int64_t tf = 1; tf < T; ++tf) {
    // Replace everything (q, k and v, all heads) of token tf in every batch row.
    Vec mod = qkv;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t c = 0; c < C3; ++c) mod[(b * T + tf) * C3 + c] = 5.0f * float(c % 7) - 11.0f;
    Vec out1(out0.size()), probs1(probs0.size());
    ops::attention_forward(out1.data(), probs1.data(), mod.data(), B, T, C, H);
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
  Vec out(sz(B * T * C)), probs(sz(B * H * T * T));
  ops::attention_forward(out.data(), probs.data(), qkv.data(), B, T, C, H);
  Vec dout = randn(rng, out.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = t0 + 1; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) dout[(b * T + t) * C + c] = 0.0f;
  Vec dqkv(qkv.size(), 0.0f);
  ops::attention_backward(dqkv.data(), dout.data(), qkv.data(), probs.data(), B, T, C, H);
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

void attention_fwd(Vec& out, Vec& probs, const Vec& X, const AttnLayout& l,
                   const ops::AttentionShape& s) {
  ops::attention_forward(out.data(), probs.data(), X.data() + l.qoff, l.ldq, X.data() + l.koff,
                         X.data() + l.voff, l.ldkv, s);
}
void attention_bwd(Vec& dX, const Vec& dout, const Vec& X, const Vec& probs, const AttnLayout& l,
                   const ops::AttentionShape& s) {
  ops::attention_backward(dX.data() + l.qoff, dX.data() + l.koff, dX.data() + l.voff, dout.data(),
                          X.data() + l.qoff, l.ldq, X.data() + l.koff, X.data() + l.voff, l.ldkv,
                          probs.data(), s);
}

void check_attention(const std::string& what, const ops::AttentionShape& s, const AttnLayout& l,
                     uint32_t seed) {
  SCOPED_TRACE(what);
  std::mt19937 rng(seed);
  const Vec X = randn(rng, sz(layout_size(l, s)));
  const Vec R = randn(rng, sz(s.B * s.Tq * s.H * s.hd));
  const DVec dX_ = to_d(X), dR = to_d(R);

  // NaN-filled: the forward must write every output and every probability (masked ones as 0).
  Vec out(R.size(), std::numeric_limits<float>::quiet_NaN());
  Vec probs(sz(s.B * s.H * s.Tq * s.Tk), std::numeric_limits<float>::quiet_NaN());
  attention_fwd(out, probs, X, l, s);
  DVec rprobs;
  EXPECT_LE(rel_err(out, gqa_attention_ref(dX_, l, s, &rprobs)), kFwdTol);
  EXPECT_LE(rel_err(probs, rprobs), kFwdTol);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t i = 0; i < s.Tq; ++i) {
        double sum = 0.0;
        for (int64_t j = 0; j < s.Tk; ++j) {
          const float p = probs[sz(((b * s.H + h) * s.Tq + i) * s.Tk + j)];
          if ((s.causal && j > i) || (s.key_len && j >= s.key_len[b]) ||
              (s.seg_start && j < s.seg_start[b * s.Tq + i])) {
            EXPECT_EQ(p, 0.0f) << "masked b=" << b << " h=" << h << " i=" << i << " j=" << j;
          }
          sum += p;
        }
        EXPECT_NEAR(sum, 1.0, 1e-6);
      }

  const Vec pre = randn(rng, X.size());
  Vec dX = pre;
  attention_bwd(dX, R, X, probs, l, s);
  expect_grad("dq|dk|dv", X, dX, pre,
              [&](const DVec& v) { return dot(gqa_attention_ref(v, l, s), dR); });
  // Exactly nothing into masked keys' k and v.
  for (int64_t b = 0; s.key_len && b < s.B; ++b)
    for (int64_t j = s.key_len[b]; j < s.Tk; ++j)
      for (int64_t c = 0; c < s.Hkv * s.hd; ++c)
        for (int64_t off : {l.koff, l.voff}) {
          const size_t at = sz(off + (b * s.Tk + j) * l.ldkv + c);
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
  Vec out0(sz(B * T * C)), probs0(sz(B * H * T * T)), out1(out0.size()), probs1(probs0.size());
  ops::attention_forward(out0.data(), probs0.data(), qkv.data(), B, T, C, H);
  ops::attention_forward(out1.data(), probs1.data(), q.data(), C, k.data(), v.data(), C, s);
  EXPECT_EQ(out0, out1);
  EXPECT_EQ(probs0, probs1);
  Vec dqkv(qkv.size(), 0.0f), dq(q.size(), 0.0f), dk(q.size(), 0.0f), dv(q.size(), 0.0f);
  ops::attention_backward(dqkv.data(), dout.data(), qkv.data(), probs0.data(), B, T, C, H);
  ops::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), C, k.data(),
                          v.data(), C, probs1.data(), s);
  for (int64_t t = 0; t < B * T; ++t)
    for (int64_t c = 0; c < C; ++c) {
      EXPECT_EQ(dq[sz(t * C + c)], dqkv[sz(t * C3 + c)]);
      EXPECT_EQ(dk[sz(t * C + c)], dqkv[sz(t * C3 + C + c)]);
      EXPECT_EQ(dv[sz(t * C + c)], dqkv[sz(t * C3 + 2 * C + c)]);
    }
}

TEST(KernelsAttention, GroupedQueryCausal) {
  const ops::AttentionShape s{kB, kT, kT, 4, 2, 4, true};
  check_attention("gqa causal", s, separate_layout(s), 45);
  const ops::AttentionShape mqa{kB, 9, 9, 4, 1, 4, true};  // one kv head for all query heads
  check_attention("mqa causal", mqa, separate_layout(mqa), 46);
}

TEST(KernelsAttention, Bidirectional) {
  const ops::AttentionShape s{kB, 6, 6, 2, 2, 4, false};
  check_attention("mha bidirectional", s, separate_layout(s), 47);
  const ops::AttentionShape g{kB, 6, 6, 4, 2, 4, false};
  check_attention("gqa bidirectional", g, separate_layout(g), 48);
}

TEST(KernelsAttention, CrossAttention) {
  const ops::AttentionShape s{kB, 4, 7, 4, 2, 4, false};  // Tq != Tk
  check_attention("cross", s, separate_layout(s), 49);
}

TEST(KernelsAttention, KeyLengthMasksPadding) {
  const int32_t key_len[kB] = {3, 7};  // batch row 0 has 4 padding keys, row 1 none
  const ops::AttentionShape cross{kB, 4, 7, 4, 2, 4, false, key_len};
  check_attention("cross, key_len", cross, separate_layout(cross), 50);
  const int32_t self_len[kB] = {4, 1};  // causal and padding together; row 1 sees key 0 only
  const ops::AttentionShape causal{kB, 6, 6, 2, 1, 4, true, self_len};
  check_attention("causal, key_len", causal, separate_layout(causal), 51);
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
  ops::AttentionShape s{kB, T, T, 4, 2, 4, true};
  s.seg_start = seg.data();
  check_attention("gqa causal, documents", s, separate_layout(s), 56);
  const int64_t L = 72;
  std::vector<int32_t> seg2(size_t(kB * L));
  for (int64_t t = 0; t < L; ++t) {
    seg2[size_t(t)] = t < 3 ? 0 : t < 70 ? 3 : 70;
    seg2[size_t(L + t)] = t < 66 ? 0 : 66;
  }
  ops::AttentionShape l{kB, L, L, 2, 1, 4, true};
  l.seg_start = seg2.data();
  check_attention("mqa causal, documents across query blocks", l, fused_layout(l, 1), 57);
}

// All-zero document starts (one document per row) give bitwise the plain causal result.
TEST(KernelsAttention, OneDocumentEqualsNoSegments) {
  const int64_t B = 2, T = 70, H = 2, hd = 4, C = H * hd;
  std::mt19937 rng(58);
  const Vec qkv = randn(rng, sz(B * T * 3 * C)), dout = randn(rng, sz(B * T * C));
  const std::vector<int32_t> zeros(size_t(B * T), 0);
  ops::AttentionShape plain{B, T, T, H, H, hd, true}, seg = plain;
  seg.seg_start = zeros.data();
  Vec out0(sz(B * T * C)), probs0(sz(B * H * T * T)), out1(out0.size()), probs1(probs0.size());
  const float *q = qkv.data(), *k = q + C, *v = q + 2 * C;
  ops::attention_forward(out0.data(), probs0.data(), q, 3 * C, k, v, 3 * C, plain);
  ops::attention_forward(out1.data(), probs1.data(), q, 3 * C, k, v, 3 * C, seg);
  EXPECT_EQ(out0, out1);
  EXPECT_EQ(probs0, probs1);
  Vec d0(qkv.size(), 0.0f), d1(qkv.size(), 0.0f);
  ops::attention_backward(d0.data(), d0.data() + C, d0.data() + 2 * C, dout.data(), q, 3 * C, k, v,
                          3 * C, probs0.data(), plain);
  ops::attention_backward(d1.data(), d1.data() + C, d1.data() + 2 * C, dout.data(), q, 3 * C, k, v,
                          3 * C, probs1.data(), seg);
  EXPECT_EQ(d0, d1);
}

TEST(KernelsAttention, StridedColumnSlices) {
  const ops::AttentionShape s{kB, kT, kT, 4, 2, 4, true};
  check_attention("fused q|k|v|pad", s, fused_layout(s, 3), 52);
  const ops::AttentionShape x{kB, 4, 6, 2, 1, 4, false};
  check_attention("separate, padded rows", x, separate_layout(x, 5, 2), 53);
}

TEST(KernelsAttention, GroupedBackwardIndependentOfThreadCount) {
  // dk and dv of a kv head sum over its query heads; the order must not depend on threads.
  const ops::AttentionShape s{3, 7, 7, 6, 2, 4, true};
  const AttnLayout l = fused_layout(s, 1);
  std::mt19937 rng(54);
  const Vec X = randn(rng, sz(layout_size(l, s))), dout = randn(rng, sz(s.B * s.Tq * s.H * s.hd));
  Vec out(dout.size()), probs(sz(s.B * s.H * s.Tq * s.Tk));
  attention_fwd(out, probs, X, l, s);
  const int saved = omp_get_max_threads();
  std::vector<Vec> grads;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    Vec dX(X.size(), 0.5f);
    attention_bwd(dX, dout, X, probs, l, s);
    grads.push_back(dX);
  }
  omp_set_num_threads(saved);
  EXPECT_EQ(grads[0], grads[1]);
  EXPECT_EQ(grads[0], grads[2]);
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
    EXPECT_THROW(ops::attention_backward(p, p, p, p, p, 8, p, p, 8, p, s), trellis::Error);
  }
}

// ---------------------------------------------------------------------------------------------
// embedding

void check_embedding(int64_t B, int64_t T, int64_t C, int64_t V, uint32_t seed) {
  SCOPED_TRACE("embedding C=" + std::to_string(C));
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> tok(0, int32_t(V - 1));
  std::vector<int32_t> tokens(sz(B * T));
  for (auto& t : tokens) t = tok(rng);
  tokens[0] = tokens[3] = tokens[B * T - 1] = 4;  // repeated tokens: scatter-adds collide
  const Vec wte = randn(rng, sz(V * C)), wpe = randn(rng, sz(T * C));
  const Vec R = randn(rng, sz(B * T * C));
  const DVec dwte_ = to_d(wte), dwpe_ = to_d(wpe), dR = to_d(R);

  // The whole table as one vocabulary slice, then positions: together GPT-2's embedding.
  auto forward = [&](Vec& out, const Vec& te, const Vec& pe) {
    ops::embedding_forward(out.data(), tokens.data(), te.data(), 0, V, B * T, C);
    ops::position_forward(out.data(), pe.data(), 0, B * T, T, C);
  };
  Vec out(sz(B * T * C));
  forward(out, wte, wpe);
  // A float add of two floats is the correctly rounded double sum: exact comparison is fair.
  const DVec ref = embedding_ref(tokens, dwte_, dwpe_, B, T, C);
  for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i], float(ref[i]));

  const Vec pre_te = randn(rng, wte.size()), pre_pe = randn(rng, wpe.size());
  Vec dwte = pre_te, dwpe = pre_pe;
  ops::embedding_backward(dwte.data(), R.data(), tokens.data(), 0, V, B * T, C);
  ops::position_backward(dwpe.data(), R.data(), 0, B * T, T, C);
  expect_grad("dwte", wte, dwte, pre_te,
              [&](const DVec& v) { return dot(embedding_ref(tokens, v, dwpe_, B, T, C), dR); });
  expect_grad("dwpe", wpe, dwpe, pre_pe,
              [&](const DVec& v) { return dot(embedding_ref(tokens, dwte_, v, B, T, C), dR); });
  // Rows of tokens that never occur keep exactly their pre-filled gradient.
  for (int64_t v = 0; v < V; ++v)
    if (std::find(tokens.begin(), tokens.end(), int32_t(v)) == tokens.end()) {
      for (int64_t c = 0; c < C; ++c) EXPECT_EQ(dwte[v * C + c], pre_te[v * C + c]);
    }
}

TEST(KernelsEmbedding, ForwardAndGradients) {
  check_embedding(kB, kT, kC, kV, 51);
  check_embedding(kB, kT, 70, kV, 52);  // C > 32: the backward splits channels in chunks
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
  d.targets[1] = int32_t(V - 1);  // the last real column
  return d;
}

TEST(KernelsCrossEntropy, LossesMatchDoubleLogSumExp) {
  const int64_t BT = kB * kT, V = kV, Vp = kVp;
  for (float stddev : {2.0f, 300.0f}) {  // large logits: must be max-shifted, never overflow
    const CeData d = make_ce(BT, V, Vp, 61, stddev);
    Vec logits = d.logits, losses(sz(BT));
    const double total =
        ops::cross_entropy(logits.data(), losses.data(), d.targets.data(), BT, V, Vp, 0, 0.0f);
    const DVec ref = cross_entropy_ref(to_d(d.logits), d.targets, BT, V, Vp);
    double ref_total = 0.0;
    for (double l : ref) ref_total += l;
    EXPECT_LE(rel_err(losses, ref), kFwdTol) << "stddev=" << stddev;
    EXPECT_NEAR(total, ref_total, kFwdTol * std::abs(ref_total)) << "stddev=" << stddev;
    for (float l : losses) EXPECT_GE(l, 0.0f);
    // grad_scale == 0: logits are left untouched.
    EXPECT_EQ(logits, d.logits);
  }
}

TEST(KernelsCrossEntropy, GradientMatchesFiniteDifferences) {
  const int64_t BT = kB * kT, V = kV, Vp = kVp;
  const CeData d = make_ce(BT, V, Vp, 62);
  const float grad_scale = 1.0f / float(BT);  // mean loss
  Vec logits = d.logits, losses(sz(BT));
  ops::cross_entropy(logits.data(), losses.data(), d.targets.data(), BT, V, Vp, 0, grad_scale);
  // cross_entropy overwrites (documented), so no prefill here: compare directly. The loss is
  // grad_scale * sum(losses); the padding columns do not enter it, so their numeric gradient is 0.
  const Vec zero(logits.size(), 0.0f);
  expect_grad("dlogits", d.logits, logits, zero, [&](const DVec& v) {
    double s = 0.0;
    for (double l : cross_entropy_ref(v, d.targets, BT, V, Vp)) s += l;
    return double(grad_scale) * s;
  });
  for (int64_t i = 0; i < BT; ++i) {
    double row_sum = 0.0;
    for (int64_t j = 0; j < Vp; ++j) {
      const float g = logits[i * Vp + j];
      if (j >= V) {
        EXPECT_EQ(g, 0.0f) << "padding column " << j << " got a gradient";
      }
      row_sum += g;
    }
    EXPECT_NEAR(row_sum, 0.0, 1e-7);  // softmax - onehot sums to zero
  }
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
  CeData d = make_ce(BT, V, Vp, 64);
  d.targets[3] = -1;  // a padding row
  for (double e : {0.1, 0.35}) {
    const float grad_scale = 1.0f / float(BT - 1);
    Vec logits = d.logits, losses(sz(BT));
    const double total = ops::cross_entropy(logits.data(), losses.data(), d.targets.data(), BT, V,
                                            Vp, 0, 0.0f, {}, float(e), V);
    const DVec ref = smoothed_ce_ref(to_d(d.logits), d.targets, BT, V, Vp, double(float(e)));
    double ref_total = 0.0;
    for (double l : ref) ref_total += l;
    EXPECT_LE(rel_err(losses, ref), kFwdTol) << "e=" << e;
    EXPECT_NEAR(total, ref_total, kFwdTol * std::abs(ref_total)) << "e=" << e;
    EXPECT_EQ(losses[3], 0.0f);
    // differs from the plain loss by far more than the tolerance (the test can fail)
    EXPECT_GT(rel_err(losses, cross_entropy_ref(to_d(d.logits), [&] {
                        auto t = d.targets;
                        t[3] = 0;
                        return t;
                      }(), BT, V, Vp)),
              1e-2);

    ops::cross_entropy(logits.data(), losses.data(), d.targets.data(), BT, V, Vp, 0, grad_scale,
                       {}, float(e), V);
    const Vec zero(logits.size(), 0.0f);
    expect_grad("smoothed dlogits", d.logits, logits, zero, [&](const DVec& v) {
      double s = 0.0;
      for (double l : smoothed_ce_ref(v, d.targets, BT, V, Vp, double(float(e)))) s += l;
      return double(grad_scale) * s;
    });
    for (int64_t i = 0; i < BT; ++i) {
      double row_sum = 0.0;
      for (int64_t j = 0; j < Vp; ++j) {
        const float g = logits[i * Vp + j];
        if (j >= V || i == 3) EXPECT_EQ(g, 0.0f) << "row " << i << " column " << j;
        row_sum += g;
      }
      EXPECT_NEAR(row_sum, 0.0, 1e-7);  // softmax - (1 - e) onehot - e/V sums to zero
    }
  }
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

// ---------------------------------------------------------------------------------------------
// accumulate / scale / add_bias / sum_squares

TEST(KernelsPointwise, AccumulateScaleAddBias) {
  std::mt19937 rng(71);
  const int64_t n = 1003;  // odd: SIMD tails
  const Vec a = randn(rng, sz(n)), b = randn(rng, sz(n));
  // Each is a single correctly rounded float operation per element: exact comparison against
  // the same expression evaluated in a plain loop.
  Vec y = a;
  ops::accumulate(y.data(), b.data(), n);
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(y[i], a[i] + b[i]);
  ops::accumulate(y.data(), b.data(), n);
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(y[i], (a[i] + b[i]) + b[i]);

  Vec x = a;
  ops::scale(x.data(), -0.37f, n);
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(x[i], a[i] * -0.37f);
  ops::scale(x.data(), 0.0f, n);
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(x[i], 0.0f);

  // add_bias: rows of a [rows, C] block get the bias (and a residual) added: y += bias + r.
  const int64_t rows = 17, C = 59;
  const Vec bias = randn(rng, sz(C)), r = randn(rng, sz(rows * C)), y0 = randn(rng, sz(rows * C));
  Vec with_res = y0, no_res = y0;
  ops::add_bias(with_res.data(), bias.data(), r.data(), rows, C);
  ops::add_bias(no_res.data(), bias.data(), nullptr, rows, C);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t c = 0; c < C; ++c) {
      const size_t k = sz(i * C + c);
      EXPECT_EQ(with_res[k], y0[k] + (bias[sz(c)] + r[k]));
      EXPECT_EQ(no_res[k], y0[k] + (bias[sz(c)] + 0.0f));
    }

  // n = 0 is a no-op.
  ops::accumulate(nullptr, nullptr, 0);
  ops::scale(nullptr, 2.0f, 0);
  EXPECT_EQ(ops::sum_squares(nullptr, 0), 0.0);
}

TEST(KernelsPointwise, SumSquaresInDouble) {
  std::mt19937 rng(72);
  const int64_t n = 1003;
  Vec x = randn(rng, sz(n));
  x[0] = 1e20f;  // squares overflow float but not double
  x[1] = 1e-3f;
  double ref = 0.0;
  for (float v : x) ref += double(v) * double(v);
  // Float*float is exact in double; only the (reordered) double sum rounds: ~n * 1e-16.
  EXPECT_NEAR(ops::sum_squares(x.data(), n), ref, 1e-12 * ref);
  x[0] = 3.0f;
  ref = 0.0;
  for (float v : x) ref += double(v) * double(v);
  EXPECT_NEAR(ops::sum_squares(x.data(), n), ref, 1e-12 * ref);
  const float three[3] = {1.0f, -2.0f, 2.0f};
  EXPECT_EQ(ops::sum_squares(three, 3), 9.0);
}

}  // namespace
