// Attention without the Tq x Tk matrix: FlashAttention-2's algorithm (Dao 2023) on the CPU.
// Forward, per (batch, head) and block of query rows: for each block of keys, S = scale Q K^T (a
// small GEMM into a per-thread tile), then an online softmax keeps each row's running max m and
// sum l, rescales the row's output accumulator by exp(m_old - m_new) and adds exp(S - m) V. Only
// lse = m + log l per row is saved. Backward recomputes P = exp(S - lse) block by block, with
// D = rowsum(dO o O) standing in for the softmax backward's <P, dP> (they are equal, dropout
// included): dS = P o (dP - D). The tiles (64 query rows x 256 keys of scores, plus a key and a
// value block of 256 rows) stay in L2; the products are oneDNN GEMMs called on the thread. A
// bidirectional sequence of at most 256 rows is one block (attention_tiles): fewer, larger GEMMs,
// each key and value read once. Masks narrow a query block's keys to those its rows see at all
// (from its first row's first key to its last row's last; padding keys past key_len are never
// read), and inside a key block a row only exponentiates its visible range [first_key,
// visible_keys). Padding query rows (query_len) are not computed: 0 out, no gradient. With
// attention dropout each (row, key block) mask is drawn once in forward and once in backward, as
// in the kernel that stores the probabilities (attention.cpp). Measured against that kernel:
// bench/RESULTS.md, "Tiled attention" and its follow-ups. A bf16 model's q, k and v are read as
// bf16 (the _bf16 entry points): each head's rows are widened into per-thread fp32 copies (Tq or
// Tk rows of hd floats) and the same algorithm runs on them, so the math stays fp32.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "trellis/kernels/cpu/attention_masks.h"
#include "trellis/kernels/cpu/bf16_lanes.h"
#include "trellis/kernels/cpu/dropout_mask.h"
#include "trellis/kernels/cpu/simd_math.h"
#include "trellis/kernels/ops.h"

namespace trellis::ops {

namespace {
using detail::block_keys;
using detail::dot_f8;
using detail::first_key;
using detail::query_rows;
using detail::visible_keys;

// max of x[0, n), n >= 1.
float row_max(const float* x, int64_t n) {
  int64_t j = 0;
  float mx = x[0];
  if (n >= 8) {
    simd::f8 m8 = simd::load8(x);
    for (j = 8; j + 8 <= n; j += 8) {
      const simd::f8 v = simd::load8(x + j);
      m8 = v > m8 ? v : m8;
    }
    mx = m8[0];
    for (int l = 1; l < 8; ++l) mx = std::max(mx, m8[l]);
  }
  for (; j < n; ++j) mx = std::max(mx, x[j]);
  return mx;
}

// exp(x - shift) in float (simd::exp8_clamped, within 2 ulps); arguments below -80 give ~1e-35
// instead of a smaller number, which no sum of at most 2^24 terms of which one is 1 can see.
inline simd::f8 exp_shifted(simd::f8 x, simd::f8 shift) {
  simd::f8 a = x - shift;
  const simd::f8 lo = simd::splat8(-80.0f), hi = simd::splat8(80.0f);
  a = a < lo ? lo : a;
  a = a > hi ? hi : a;
  return simd::exp8_clamped(a);
}

// In place x[j] <- exp(x[j] - shift), j < n; returns their sum in double (fixed lane order) when
// `sum` is set.
double exp_row(float* x, int64_t n, float shift, bool sum) {
  const simd::f8 s8 = simd::splat8(shift);
  simd::d4 acc = {};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const simd::f8 e = exp_shifted(simd::load8(x + j), s8);
    simd::store8(x + j, e);
    if (sum) {
      acc += __builtin_convertvector(__builtin_shufflevector(e, e, 0, 1, 2, 3), simd::d4);
      acc += __builtin_convertvector(__builtin_shufflevector(e, e, 4, 5, 6, 7), simd::d4);
    }
  }
  double total = (acc[0] + acc[1]) + (acc[2] + acc[3]);
  if (j < n) {
    const simd::f8 e = exp_shifted(simd::load8_partial(x + j, n - j), s8);
    simd::store8_partial(x + j, e, n - j);
    for (int64_t l = 0; l < n - j; ++l) total += double(e[l]);
  }
  return total;
}

// The visible columns [a, e) of query row i within the key block [j0, j1), relative to j0 (a >= e
// when the row sees none of it).
struct Cols {
  int64_t a, e;
};
Cols visible_cols(const AttentionShape& s, int64_t b, int64_t i, int64_t j0, int64_t j1) {
  return {std::max(first_key(s, b, i), j0) - j0, std::min(visible_keys(s, b, i), j1) - j0};
}

// The dropout multipliers of row i's visible keys [j0 + c.a, j0 + c.e), into m[c.a, c.e).
void row_mask(float* m, const AttentionShape& s, int64_t b, int64_t h, int64_t i, int64_t j0,
              Cols c) {
  dropout_multipliers(m + c.a, j0 + c.a, c.e - c.a, s.dropout, uint64_t(i),
                      uint64_t(s.dropout.seq0 + b), uint64_t(s.dropout.head0 + h));
}

// Rows [0, n) of one head (hd columns at stride ld) as fp32 rows: fp32 ones as they are, bf16
// ones widened (exactly) into buf at stride hd.
struct HeadRows {
  const float* p;
  int64_t ld;
};
HeadRows head_rows(const float* x, int64_t ld, int64_t, int64_t, std::vector<float>&) {
  return {x, ld};
}
HeadRows head_rows(const uint16_t* x, int64_t ld, int64_t n, int64_t hd, std::vector<float>& buf) {
  if (buf.size() < size_t(n * hd)) buf.resize(size_t(n * hd));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t d = 0; d < hd; ++d) buf[size_t(r * hd + d)] = simd::widen_bf16(x[r * ld + d]);
  return {buf.data(), hd};
}
}  // namespace

AttentionTiles attention_tiles(const AttentionShape& s) {
  constexpr int64_t kKeys = 256, kCausalQueries = 64;
  const int64_t queries = s.tiles.queries > 0 ? s.tiles.queries
                          : !s.causal && s.Tq <= kKeys ? std::max<int64_t>(1, s.Tq)
                                                       : kCausalQueries;
  return {queries, s.tiles.keys > 0 ? s.tiles.keys : kKeys};
}

namespace {
template <class E>
void tiled_forward(float* out, float* lse, const E* q, int64_t ldq, const E* k, const E* v,
                   int64_t ldkv, const AttentionShape& s) {
  detail::check_attention_shape(s);
  const int64_t hd = s.hd, Tq = s.Tq, C = s.H * hd, group = s.H / s.Hkv;
  const AttentionTiles tiles = attention_tiles(s);
  const int64_t Br = tiles.queries, Bc = tiles.keys;
  const float scale = 1.0f / std::sqrt(float(hd));
  const bool drop = s.dropout.p > 0.0f;
  constexpr float kNoMax = -std::numeric_limits<float>::infinity();
#pragma omp parallel
  {
    // Per thread: a block of scores/probabilities, its dropout multipliers, the output
    // accumulator, and each row's running max and sum.
    std::vector<float> sc(size_t(Br * Bc)), mk(drop ? size_t(Br * Bc) : 0), acc(size_t(Br * hd));
    std::vector<float> mrow(static_cast<size_t>(Br));
    std::vector<double> lrow(static_cast<size_t>(Br));
    std::vector<float> qbuf, kbuf, vbuf;  // bf16 inputs: this head's rows widened
#pragma omp for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < s.B * s.H; ++bh) {
      const int64_t b = bh / s.H, h = bh % s.H, kv = (h / group) * hd;
      const int64_t rows = query_rows(s, b);
      const auto [qh, ldq_h] = head_rows(q + b * Tq * ldq + h * hd, ldq, rows, hd, qbuf);
      const auto [kh, ldkv_h] = head_rows(k + b * s.Tk * ldkv + kv, ldkv, s.Tk, hd, kbuf);
      const float* vh = head_rows(v + b * s.Tk * ldkv + kv, ldkv, s.Tk, hd, vbuf).p;
      float* oh = out + b * Tq * C + h * hd;
      for (int64_t i = rows; i < Tq; ++i) {  // padding rows: 0, computed by nobody
        std::fill_n(oh + i * C, hd, 0.0f);
        lse[bh * Tq + i] = 0.0f;
      }
      for (int64_t i0 = 0; i0 < rows; i0 += Br) {
        const int64_t i1 = std::min(rows, i0 + Br), m = i1 - i0;
        // Keys [lo, n): those any row of the block sees.
        const int64_t lo = first_key(s, b, i0), n = block_keys(s, b, i1);
        std::fill_n(mrow.begin(), m, kNoMax);
        std::fill_n(lrow.begin(), m, 0.0);
        std::fill_n(acc.begin(), m * hd, 0.0f);
        for (int64_t j0 = lo; j0 < n; j0 += Bc) {
          const int64_t j1 = std::min(n, j0 + Bc), nk = j1 - j0;
          gemm(false, true, m, nk, hd, scale, qh + i0 * ldq_h, ldq_h, kh + j0 * ldkv_h, ldkv_h,
               0.0f, sc.data(), Bc);
          for (int64_t r = 0; r < m; ++r) {
            const Cols c = visible_cols(s, b, i0 + r, j0, j1);
            float* row = sc.data() + r * Bc;
            if (c.a >= c.e) {  // this row sees none of the block
              std::fill_n(row, nk, 0.0f);
              continue;
            }
            const float m_new = std::max(mrow[size_t(r)], row_max(row + c.a, c.e - c.a));
            // exp(-inf) = 0 on a row's first visible block: its accumulator and sum are 0.
            const float alpha = std::exp(mrow[size_t(r)] - m_new);
            mrow[size_t(r)] = m_new;
            lrow[size_t(r)] =
                lrow[size_t(r)] * double(alpha) + exp_row(row + c.a, c.e - c.a, m_new, true);
            if (alpha != 1.0f) {
              float* o = acc.data() + r * hd;
              for (int64_t d = 0; d < hd; ++d) o[d] *= alpha;
            }
            std::fill_n(row, c.a, 0.0f);
            std::fill(row + c.e, row + nk, 0.0f);
            if (drop) {  // the sum keeps the undropped P; the values see P o M / (1 - p)
              float* mr = mk.data() + r * Bc;
              row_mask(mr, s, b, h, i0 + r, j0, c);
              for (int64_t j = c.a; j < c.e; ++j) row[j] *= mr[j];
            }
          }
          gemm(false, false, m, hd, nk, 1.0f, sc.data(), Bc, vh + j0 * ldkv_h, ldkv_h, 1.0f,
               acc.data(), hd);
        }
        for (int64_t r = 0; r < m; ++r) {
          const double l = lrow[size_t(r)];
          const float inv = float(1.0 / l);
          const float* o = acc.data() + r * hd;
          float* y = oh + (i0 + r) * C;
          for (int64_t d = 0; d < hd; ++d) y[d] = o[d] * inv;
          lse[bh * Tq + i0 + r] = float(double(mrow[size_t(r)]) + std::log(l));
        }
      }
    }
  }
}

template <class E>
void tiled_backward(float* dq, float* dk, float* dv, const float* dout, const E* q, int64_t ldq,
                    const E* k, const E* v, int64_t ldkv, const float* out, const float* lse,
                    const AttentionShape& s) {
  detail::check_attention_shape(s);
  const int64_t hd = s.hd, Tq = s.Tq, C = s.H * hd, group = s.H / s.Hkv;
  const AttentionTiles tiles = attention_tiles(s);
  const int64_t Br = tiles.queries, Bc = tiles.keys;
  const float scale = 1.0f / std::sqrt(float(hd));
  const bool drop = s.dropout.p > 0.0f;
  // One work item per (batch, kv head): the query heads sharing its k and v add into dk and dv one
  // after the other, in head order, so there is no race and the sums do not depend on threads.
#pragma omp parallel
  {
    // Per thread: P, dP (then dS), P o M / (1 - p) under dropout, and each row's D.
    std::vector<float> pb(size_t(Br * Bc)), dpb(size_t(Br * Bc)), pm(drop ? size_t(Br * Bc) : 0);
    std::vector<float> drow(static_cast<size_t>(Br));
    std::vector<float> qbuf, kbuf, vbuf;  // bf16 inputs: this head's rows widened
#pragma omp for schedule(dynamic, 1)
    for (int64_t bg = 0; bg < s.B * s.Hkv; ++bg) {
      const int64_t b = bg / s.Hkv, g = bg % s.Hkv, kv = g * hd;
      const auto [kh, ldkv_h] = head_rows(k + b * s.Tk * ldkv + kv, ldkv, s.Tk, hd, kbuf);
      const float* vh = head_rows(v + b * s.Tk * ldkv + kv, ldkv, s.Tk, hd, vbuf).p;
      float* dkh = dk + b * s.Tk * ldkv + kv;
      float* dvh = dv + b * s.Tk * ldkv + kv;
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        const int64_t rows = query_rows(s, b);  // padding rows get no gradient
        const auto [qh, ldq_h] = head_rows(q + b * Tq * ldq + h * hd, ldq, rows, hd, qbuf);
        float* dqh = dq + b * Tq * ldq + h * hd;
        const float* dy = dout + b * Tq * C + h * hd;
        const float* oh = out + b * Tq * C + h * hd;
        const float* lh = lse + (b * s.H + h) * Tq;
        for (int64_t i0 = 0; i0 < rows; i0 += Br) {
          const int64_t i1 = std::min(rows, i0 + Br), m = i1 - i0;
          const int64_t lo = first_key(s, b, i0), n = block_keys(s, b, i1);
          for (int64_t r = 0; r < m; ++r)
            drow[size_t(r)] = dot_f8(dy + (i0 + r) * C, oh + (i0 + r) * C, hd);
          for (int64_t j0 = lo; j0 < n; j0 += Bc) {
            const int64_t j1 = std::min(n, j0 + Bc), nk = j1 - j0;
            gemm(false, true, m, nk, hd, scale, qh + i0 * ldq_h, ldq_h, kh + j0 * ldkv_h, ldkv_h,
                 0.0f, pb.data(), Bc);  // S
            gemm(false, true, m, nk, hd, 1.0f, dy + i0 * C, C, vh + j0 * ldkv_h, ldkv_h, 0.0f,
                 dpb.data(), Bc);  // dP (of the dropped probabilities)
            for (int64_t r = 0; r < m; ++r) {
              const Cols c = visible_cols(s, b, i0 + r, j0, j1);
              float* p = pb.data() + r * Bc;
              float* dp = dpb.data() + r * Bc;
              // Visible columns [a, e) (empty when the row sees none of the block).
              const int64_t a = std::min(c.a, nk), e = std::max(a, c.e);
              exp_row(p + a, e - a, lh[i0 + r], false);  // P
              std::fill_n(p, a, 0.0f);
              std::fill(p + e, p + nk, 0.0f);
              if (drop) {  // the forward's mask again: dP o M / (1 - p); dV from P o M / (1 - p)
                float* mr = pm.data() + r * Bc;
                std::fill_n(mr, nk, 0.0f);
                if (e > a) row_mask(mr, s, b, h, i0 + r, j0, {a, e});
                for (int64_t j = a; j < e; ++j) {
                  dp[j] *= mr[j];
                  mr[j] *= p[j];
                }
              }
              // dS = P o (dP - D), with the scores' 1/sqrt(hd) folded in; 0 where P is.
              const float dr = drow[size_t(r)];
              std::fill_n(dp, a, 0.0f);
              for (int64_t j = a; j < e; ++j) dp[j] = p[j] * (dp[j] - dr) * scale;
              std::fill(dp + e, dp + nk, 0.0f);
            }
            gemm(true, false, nk, hd, m, 1.0f, drop ? pm.data() : pb.data(), Bc, dy + i0 * C, C,
                 1.0f, dvh + j0 * ldkv, ldkv);  // dV += P^T dO
            gemm(false, false, m, hd, nk, 1.0f, dpb.data(), Bc, kh + j0 * ldkv_h, ldkv_h, 1.0f,
                 dqh + i0 * ldq, ldq);  // dQ += dS K
            gemm(true, false, nk, hd, m, 1.0f, dpb.data(), Bc, qh + i0 * ldq_h, ldq_h, 1.0f,
                 dkh + j0 * ldkv, ldkv);  // dK += dS^T Q
          }
        }
      }
    }
  }
}
}  // namespace

void attention_forward(float* out, float* lse, const float* q, int64_t ldq, const float* k,
                       const float* v, int64_t ldkv, const AttentionShape& s) {
  tiled_forward(out, lse, q, ldq, k, v, ldkv, s);
}

void attention_forward_bf16(float* out, float* lse, const uint16_t* q, int64_t ldq,
                            const uint16_t* k, const uint16_t* v, int64_t ldkv,
                            const AttentionShape& s) {
  tiled_forward(out, lse, q, ldq, k, v, ldkv, s);
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        int64_t ldq, const float* k, const float* v, int64_t ldkv, const float* out,
                        const float* lse, const AttentionShape& s) {
  tiled_backward(dq, dk, dv, dout, q, ldq, k, v, ldkv, out, lse, s);
}

void attention_backward_bf16(float* dq, float* dk, float* dv, const float* dout,
                             const uint16_t* q, int64_t ldq, const uint16_t* k, const uint16_t* v,
                             int64_t ldkv, const float* out, const float* lse,
                             const AttentionShape& s) {
  tiled_backward(dq, dk, dv, dout, q, ldq, k, v, ldkv, out, lse, s);
}

void attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t C,
                       int64_t H) {
  attention_forward(out, lse, qkv, 3 * C, qkv + C, qkv + 2 * C, 3 * C,
                    {B, T, T, H, H, C / H, true});
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int64_t B, int64_t T, int64_t C, int64_t H) {
  attention_backward(dqkv, dqkv + C, dqkv + 2 * C, dout, qkv, 3 * C, qkv + C, qkv + 2 * C, 3 * C,
                     out, lse, {B, T, T, H, H, C / H, true});
}

}  // namespace trellis::ops
