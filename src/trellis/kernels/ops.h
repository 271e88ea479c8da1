#pragma once
// The op set on the CPU: plain functions over row-major float arrays. Each backward *accumulates*
// into its gradient outputs (+=), so micro-batches and residual branches add up without copies.
// B = batch, T = time, C = channels, BT = B*T rows.
#include <cstdint>
#include <functional>

namespace trellis::ops {

// C[M,N] = alpha * op(A) * op(B) + beta * C, row-major, via the BLAS backend. Called inside an
// OpenMP parallel region it runs on the calling thread only.
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// out[rows,C] += bias[C] (+ residual[rows,C] when not null).
void add_bias(float* out, const float* bias, const float* residual, int64_t rows, int64_t C);
// dbias[C] += column sums of dout[rows,C].
void bias_backward(float* dbias, const float* dout, int64_t rows, int64_t C);

// out[BT,OC] = inp[BT,IC] @ w[IC,OC] + bias[OC] (HF Conv1D layout; bias may be null).
void linear_forward(float* out, const float* inp, const float* w, const float* bias, int64_t BT,
                    int64_t IC, int64_t OC);
void linear_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp,
                     const float* w, int64_t BT, int64_t IC, int64_t OC);

// LayerNorm over the last dim; saves mean and rstd (BT each) for backward.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int64_t BT, int64_t C, float eps = 1e-5f);
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int64_t BT, int64_t C);

// GELU, tanh approximation (GPT-2's "gelu_new").
void gelu_forward(float* out, const float* inp, int64_t n);
void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n);

// Causal multi-head attention. qkv[B,T,3C] holds q|k|v; out[B,T,C]; probs[B,H,T,T] is saved.
void attention_forward(float* out, float* probs, const float* qkv, int64_t B, int64_t T, int64_t C,
                       int64_t H);
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* probs,
                        int64_t B, int64_t T, int64_t C, int64_t H);

// Token embedding over a slice of the vocabulary (rows [vocab_start, vocab_start + vocab_rows)
// of the table are `wte`): out[i,:] = wte[tokens[i] - vocab_start,:], zero for tokens outside the
// slice. With the whole table (start 0) this is the plain lookup.
void embedding_forward(float* out, const int32_t* tokens, const float* wte, int64_t vocab_start,
                       int64_t vocab_rows, int64_t n, int64_t C);
void embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int64_t vocab_start,
                        int64_t vocab_rows, int64_t n, int64_t C);
// Position embedding of rows [row0, row0 + rows) of a [B*T, C] batch: out[i,:] +=
// wpe[(row0+i)%T,:].
void position_forward(float* out, const float* wpe, int64_t row0, int64_t rows, int64_t T,
                      int64_t C);
void position_backward(float* dwpe, const float* dout, int64_t row0, int64_t rows, int64_t T,
                       int64_t C);

// Combines per-row statistics across ranks that each hold a slice of the vocabulary:
// combine(buf, n, is_max) reduces n doubles in place (max or sum). Empty = one rank holds all.
using RowCombine = std::function<void(double* buf, int64_t n, bool is_max)>;

// Cross-entropy over logits[BT, ld] whose columns are vocabulary ids
// [vocab_start, vocab_start + ld); only the first `valid` columns are real vocabulary (the rest is
// padding and never enters the loss). Writes per-row losses; returns their sum (double, in row
// order). When grad_scale != 0, overwrites logits with dlogits = grad_scale * (softmax - onehot),
// zero on padding columns.
double cross_entropy(float* logits, float* losses, const int32_t* targets, int64_t BT,
                     int64_t valid, int64_t ld, int64_t vocab_start, float grad_scale,
                     const RowCombine& combine = {});

// y += x.
void accumulate(float* y, const float* x, int64_t n);
// x[0, n) = 0, split across threads (a single-threaded memset of GPT-2's gradients was ~25 ms).
void zero(float* x, int64_t n);
// x *= s.
void scale(float* x, float s, int64_t n);
// sum of squares in double.
double sum_squares(const float* x, int64_t n);

}  // namespace trellis::ops
