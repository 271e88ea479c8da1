// Attention keeping the softmax probabilities for backward (Tq x Tk per head): the model's kernel
// before the tiled one (attention_tiled.cpp), kept as its reference in the tests and
// bench/attention_bench; and attention over a key/value cache (decoding). Per (batch, head) with
// small GEMMs; causal and padding masks both leave each query row a prefix of visible keys, so
// one prefix softmax serves every variant; document segments (seg_start) cut that prefix's front
// (attention_masks.h), and a block of query rows computes its scores from the first row's start
// on. Without segments every start is 0.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "trellis/core/error.h"
#include "trellis/kernels/cpu/attention_masks.h"
#include "trellis/kernels/cpu/dropout_mask.h"
#include "trellis/kernels/cpu/simd_math.h"
#include "trellis/kernels/ops.h"

namespace trellis::ops {

namespace {
using detail::block_keys;
using detail::dot_f8;
using detail::first_key;
using detail::visible_keys;

// In place: row[0, n) <- softmax(row[0, n)), row[n, T) <- 0. The exponentials go through
// simd::exp (double, 4 lanes) and are summed in double with a fixed lane order.
void softmax_causal_row(float* row, int64_t n, int64_t T) {
  float mx = row[0];
  for (int64_t j = 1; j < n; ++j) mx = std::max(mx, row[j]);
  const simd::d4 mx4 = simd::splat(double(mx));
  simd::d4 acc = {};
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    const simd::d4 e = simd::exp(simd::load4(row + j) - mx4);
    simd::store4(row + j, e);
    acc += simd::load4(row + j);  // the rounded values, as normalised below
  }
  double sum = (acc[0] + acc[1]) + (acc[2] + acc[3]);
  for (; j < n; ++j) {
    row[j] = float(std::exp(double(row[j]) - double(mx)));
    sum += double(row[j]);
  }
  const float inv = float(1.0 / sum);
  for (j = 0; j < n; ++j) row[j] *= inv;
  for (j = n; j < T; ++j) row[j] = 0.0f;
}

// Causal attention runs in blocks of query rows, each against only the keys its last row sees,
// which skips most of the masked upper triangle (a block of 64 rows keeps the GEMMs efficient).
int64_t query_block(const AttentionShape& s) { return s.causal ? 64 : s.Tq; }
}  // namespace

void attention_probs_forward(float* out, float* probs, const float* q, int64_t ldq, const float* k,
                             const float* v, int64_t ldkv, const AttentionShape& s) {
  detail::check_attention_shape(s);
  const int64_t hd = s.hd, Tq = s.Tq, Tk = s.Tk, C = s.H * hd, group = s.H / s.Hkv;
  const float scale = 1.0f / std::sqrt(float(hd));
  const bool drop = s.dropout.p > 0.0f;
#pragma omp parallel
  {
    std::vector<float> pd;  // dropout: the block's dropped probabilities P o M / (1 - p)
#pragma omp for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < s.B * s.H; ++bh) {
      const int64_t b = bh / s.H, h = bh % s.H, kv = (h / group) * hd;
      const float* qh = q + b * Tq * ldq + h * hd;
      const float* kh = k + b * Tk * ldkv + kv;
      const float* vh = v + b * Tk * ldkv + kv;
      float* p = probs + bh * Tq * Tk;
      float* oh = out + b * Tq * C + h * hd;
      for (int64_t i0 = 0; i0 < Tq; i0 += query_block(s)) {
        const int64_t i1 = std::min(Tq, i0 + query_block(s)), n = block_keys(s, b, i1);
        const int64_t lo = first_key(s, b, i0);  // the block's rows see no key before it
        gemm(false, true, i1 - i0, n - lo, hd, scale, qh + i0 * ldq, ldq, kh + lo * ldkv, ldkv,
             0.0f, p + i0 * Tk + lo, Tk);
        for (int64_t i = i0; i < i1; ++i) {
          const int64_t first = first_key(s, b, i);
          float* row = p + i * Tk;
          softmax_causal_row(row + first, visible_keys(s, b, i) - first, Tk - first);
          std::fill(row, row + first, 0.0f);
        }
        const float* pv = p + i0 * Tk + lo;
        if (drop) {
          pd.resize(size_t((i1 - i0) * Tk));
          for (int64_t i = i0; i < i1; ++i) {  // masks of the keys row i sees; 0 beyond
            const int64_t vis = visible_keys(s, b, i);
            float* m = pd.data() + (i - i0) * Tk + lo;
            dropout_multipliers(m, lo, vis - lo, s.dropout, uint64_t(i),
                                uint64_t(s.dropout.seq0 + b), uint64_t(s.dropout.head0 + h));
            const float* row = p + i * Tk + lo;
            for (int64_t j = 0; j < vis - lo; ++j) m[j] *= row[j];
            std::fill(m + (vis - lo), m + (n - lo), 0.0f);
          }
          pv = pd.data() + lo;
        }
        gemm(false, false, i1 - i0, hd, n - lo, 1.0f, pv, Tk, vh + lo * ldkv, ldkv, 0.0f,
             oh + i0 * C, C);
      }
    }
  }
}

void attention_probs_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                              int64_t ldq, const float* k, const float* v, int64_t ldkv,
                              const float* probs, const AttentionShape& s) {
  detail::check_attention_shape(s);
  const int64_t hd = s.hd, Tq = s.Tq, Tk = s.Tk, C = s.H * hd, group = s.H / s.Hkv;
  const float scale = 1.0f / std::sqrt(float(hd));
  // One work item per (batch, kv head): the query heads sharing its k and v add into dk and dv one
  // after the other, in head order, so there is no race and the sums do not depend on threads.
  const bool drop = s.dropout.p > 0.0f;
#pragma omp parallel
  {
    std::vector<float> dp(size_t(Tq * Tk));
    std::vector<float> pd(drop ? size_t(query_block(s) * Tk) : 0);  // P o M / (1 - p), a block
#pragma omp for schedule(dynamic, 1)
    for (int64_t bg = 0; bg < s.B * s.Hkv; ++bg) {
      const int64_t b = bg / s.Hkv, g = bg % s.Hkv, kv = g * hd;
      const float* kh = k + b * Tk * ldkv + kv;
      const float* vh = v + b * Tk * ldkv + kv;
      float* dkh = dk + b * Tk * ldkv + kv;
      float* dvh = dv + b * Tk * ldkv + kv;
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        const float* qh = q + b * Tq * ldq + h * hd;
        float* dqh = dq + b * Tq * ldq + h * hd;
        const float* p = probs + (b * s.H + h) * Tq * Tk;
        const float* dy = dout + b * Tq * C + h * hd;
        for (int64_t i0 = 0; i0 < Tq; i0 += query_block(s)) {
          const int64_t i1 = std::min(Tq, i0 + query_block(s)), m = i1 - i0;
          const int64_t n = block_keys(s, b, i1), lo = first_key(s, b, i0), nk = n - lo;
          const float* pb = p + i0 * Tk + lo;
          const float* dyb = dy + i0 * C;
          float* db = dp.data() + i0 * Tk + lo;
          // Keys [lo, n) only: the block's rows see no other.
          gemm(false, true, m, nk, hd, 1.0f, dyb, C, vh + lo * ldkv, ldkv, 0.0f, db, Tk);  // dP
          const float* pv = pb;
          if (drop) {  // the forward's mask again: d(P o M s) -> dP o M s; dV from P o M s
            for (int64_t i = i0; i < i1; ++i) {
              // The keys row i sees (softmax backward zeroes dP beyond them; P is 0 there).
              const int64_t vis = visible_keys(s, b, i) - lo;
              float* mk = pd.data() + (i - i0) * Tk + lo;
              dropout_multipliers(mk, lo, vis, s.dropout, uint64_t(i), uint64_t(s.dropout.seq0 + b),
                                  uint64_t(s.dropout.head0 + h));
              const float* prow = p + i * Tk + lo;
              float* drow = dp.data() + i * Tk + lo;
              for (int64_t j = 0; j < vis; ++j) {
                drow[j] *= mk[j];
                mk[j] *= prow[j];
              }
              std::fill(mk + vis, mk + nk, 0.0f);
            }
            pv = pd.data() + lo;
          }
          gemm(true, false, nk, hd, m, 1.0f, pv, Tk, dyb, C, 1.0f, dvh + lo * ldkv, ldkv);  // dV
          // Softmax backward, with the 1/sqrt(hd) of the scores folded in: dS = P*(dP - <P,dP>).
          for (int64_t i = i0; i < i1; ++i) {
            const int64_t v = visible_keys(s, b, i), first = first_key(s, b, i);
            const float* prow = p + i * Tk;
            float* drow = dp.data() + i * Tk;
            const float dot = dot_f8(prow + first, drow + first, v - first);
            for (int64_t j = lo; j < first; ++j) drow[j] = 0.0f;
            for (int64_t j = first; j < v; ++j) drow[j] = prow[j] * (drow[j] - dot) * scale;
            for (int64_t j = v; j < n; ++j) drow[j] = 0.0f;
          }
          // dQ += dS K, dK += dS^T Q.
          gemm(false, false, m, hd, nk, 1.0f, db, Tk, kh + lo * ldkv, ldkv, 1.0f, dqh + i0 * ldq,
               ldq);
          gemm(true, false, nk, hd, m, 1.0f, db, Tk, qh + i0 * ldq, ldq, 1.0f, dkh + lo * ldkv,
               ldkv);
        }
      }
    }
  }
}

void attention_cached(float* out, const float* q, int64_t ldq, const float* const* k,
                      const float* const* v, const CachedAttentionShape& s) {
  TRELLIS_CHECK(s.Hkv > 0 && s.H % s.Hkv == 0, "attention: H={} is not a multiple of Hkv={}", s.H,
                s.Hkv);
  const int64_t hd = s.hd, C = s.H * hd, group = s.H / s.Hkv;
  const float scale = 1.0f / std::sqrt(float(hd));
#pragma omp parallel
  {
    std::vector<float> p;
#pragma omp for schedule(dynamic, 1)
    for (int64_t rh = 0; rh < s.rows * s.H; ++rh) {
      const int64_t r = rh / s.H, h = rh % s.H, kv = (h / group) * hd;
      const int64_t q0 = s.qrow[r], m = s.qrow[r + 1] - q0;
      const int64_t nk = s.keys[r] + (s.causal ? m : 0);  // keys the last query sees
      if (m == 0) continue;
      const float* kh = k[r] + kv;
      const float* vh = v[r] + kv;
      const float* qh = q + q0 * ldq + h * hd;
      float* oh = out + q0 * C + h * hd;
      p.resize(size_t(m * nk));
      if (m == 1) {  // one decoding step: dot products, not a GEMM call per head
        for (int64_t j = 0; j < nk; ++j) p[size_t(j)] = dot_f8(qh, kh + j * s.ldkv, hd) * scale;
      } else {
        gemm(false, true, m, nk, hd, scale, qh, ldq, kh, s.ldkv, 0.0f, p.data(), nk);
      }
      for (int64_t i = 0; i < m; ++i)
        softmax_causal_row(p.data() + i * nk, s.causal ? s.keys[r] + i + 1 : nk, nk);
      if (m == 1) {
        std::fill_n(oh, hd, 0.0f);
        for (int64_t j = 0; j < nk; ++j) {
          const float pj = p[size_t(j)];
          const float* vj = vh + j * s.ldkv;
          for (int64_t d = 0; d < hd; ++d) oh[d] += pj * vj[d];
        }
      } else {
        gemm(false, false, m, hd, nk, 1.0f, p.data(), nk, vh, s.ldkv, 0.0f, oh, C);
      }
    }
  }
}

}  // namespace trellis::ops
