// GEMM through oneDNN and the linear layer built on it.
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <vector>

#include "trellis/core/error.h"
#include "trellis/kernels/cpu/gemm_split.h"
#include "trellis/kernels/ops.h"

namespace trellis::ops {

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  std::vector<dnnl_status_t> status(size_t(omp_get_max_threads()), dnnl_success);
  for_each_gemm_block(M, N, K, [&](int t, bool split_n, int64_t lo, int64_t hi) {
    dnnl_status_t& st = status[size_t(t)];
    const char ta = trans_a ? 'T' : 'N', tb = trans_b ? 'T' : 'N';
    if (split_n)
      st = dnnl_sgemm(ta, tb, M, hi - lo, K, alpha, A, lda, trans_b ? B + lo * ldb : B + lo, ldb,
                      beta, C + lo, ldc);
    else
      st = dnnl_sgemm(ta, tb, hi - lo, N, K, alpha, trans_a ? A + lo : A + lo * lda, lda, B, ldb,
                      beta, C + lo * ldc, ldc);
  });
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

void gemm_operands(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                   const GemmOperand& A, const GemmOperand& B, float beta, float* C, int64_t ldc) {
  TRELLIS_CHECK(A.f32 && B.f32 && !A.bf16 && !B.bf16, "the fp32 GEMM got a bf16 operand");
  gemm(trans_a, trans_b, M, N, K, alpha, A.f32, A.ld, B.f32, B.ld, beta, C, ldc);
}

}  // namespace trellis::ops
