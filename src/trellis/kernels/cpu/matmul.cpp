// GEMM through oneDNN and the linear layer built on it.
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <vector>

#include "trellis/core/error.h"
#include "trellis/kernels/ops.h"

namespace trellis::ops {

namespace {
void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  const dnnl_status_t st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, A,
                                      lda, B, ldb, beta, C, ldc);
  TRELLIS_CHECK(st == dnnl_success, "dnnl_sgemm failed with status {}", int(st));
}
}  // namespace

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  // Outside a parallel region we split C ourselves into one block per thread along its larger
  // dimension and let oneDNN run each block on its own thread. oneDNN's own partitioning of the
  // GPT-2 shapes is poor for some of them (measured by bench/gemm_shapes: [256 x 768] x
  // [768 x 3072] ran at ~40% of the speed of two half-width calls). Each element of C is still
  // computed by one call over the full K, and the split depends only on the thread count, so
  // results are reproducible run to run.
  const int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
  constexpr double kMinFlopsToSplit = 4e6;
  if (nt <= 1 || 2.0 * double(M) * double(N) * double(K) < kMinFlopsToSplit) {
    sgemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  const bool split_n = N >= M;
  const int64_t D = split_n ? N : M;
  constexpr int64_t kAlign = 16;  // block edges on 64-byte boundaries of C's rows
  std::vector<dnnl_status_t> status(size_t(nt), dnnl_success);
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num(), n_threads = omp_get_num_threads();
    auto edge = [&](int i) {
      return std::min(D, (D * i / n_threads + kAlign / 2) / kAlign * kAlign);
    };
    const int64_t lo = t == 0 ? 0 : edge(t), hi = t == n_threads - 1 ? D : edge(t + 1);
    if (hi > lo) {
      if (split_n)
        status[size_t(t)] =
            dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, hi - lo, K, alpha, A, lda,
                       trans_b ? B + lo * ldb : B + lo, ldb, beta, C + lo, ldc);
      else
        status[size_t(t)] =
            dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', hi - lo, N, K, alpha,
                       trans_a ? A + lo : A + lo * lda, lda, B, ldb, beta, C + lo * ldc, ldc);
    }
  }
  for (dnnl_status_t st : status)
    TRELLIS_CHECK(st == dnnl_success, "dnnl_sgemm failed with status {}", int(st));
}

void linear_forward(float* out, const float* inp, const float* w, const float* bias, int64_t BT,
                    int64_t IC, int64_t OC) {
  if (bias) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < BT; ++i)
      for (int64_t o = 0; o < OC; ++o) out[i * OC + o] = bias[o];
  }
  gemm(false, false, BT, OC, IC, 1.0f, inp, IC, w, OC, bias ? 1.0f : 0.0f, out, OC);
}

void linear_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp,
                     const float* w, int64_t BT, int64_t IC, int64_t OC) {
  if (dinp) gemm(false, true, BT, IC, OC, 1.0f, dout, OC, w, OC, 1.0f, dinp, IC);
  gemm(true, false, IC, OC, BT, 1.0f, inp, IC, dout, OC, 1.0f, dw, OC);
  if (dbias) bias_backward(dbias, dout, BT, OC);
}

void add_bias(float* out, const float* bias, const float* residual, int64_t rows, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < rows; ++i) {
    float* y = out + i * C;
    const float* r = residual ? residual + i * C : nullptr;
    if (bias)
      for (int64_t c = 0; c < C; ++c) y[c] += bias[c] + (r ? r[c] : 0.0f);
    else if (r)
      for (int64_t c = 0; c < C; ++c) y[c] += r[c];
  }
}

void fill_rows(float* out, int64_t ld, const float* values, int64_t rows, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < rows; ++i) std::copy_n(values, C, out + i * ld);
}

void bias_backward(float* dbias, const float* dout, int64_t rows, int64_t C, int64_t ld) {
  if (ld == 0) ld = C;
    // Column sums; split columns across threads so there is no reduction race.
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < C; c0 += 64) {
    const int64_t c1 = std::min(C, c0 + 64);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t c = c0; c < c1; ++c) dbias[c] += dout[i * ld + c];
  }
}

}  // namespace trellis::ops
