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

// The GEMM of mixed precision (PyTorch's autocast): op(A) and op(B) rounded to bf16 (nearest
// even), products accumulated in fp32, C in fp32. Same arguments as gemm. Fast with AVX512-BF16;
// emulated (an fp32 GEMM of the rounded operands) below AVX-512.
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
               int64_t ldc);
// fp32 -> bf16 bits, round to nearest even (subnormals kept, NaN stays NaN); and back (exact).
void to_bf16(uint16_t* out, const float* in, int64_t n);
void from_bf16(float* out, const uint16_t* in, int64_t n);

// A GEMM operand stored in either precision, rows of stride ld: fp32 values, or bf16 bits
// already rounded with to_bf16. A bf16 GEMM reads bf16 bits as they are, so rounding once and
// reusing the copy (a weight across micro-batches, dy across both backward GEMMs) gives the same
// bits as rounding at every call.
struct GemmOperand {
  const float* f32 = nullptr;
  const uint16_t* bf16 = nullptr;
  int64_t ld = 0;
};
// gemm over such operands: the fp32 GEMM takes fp32 ones only; gemm_bf16_operands takes both
// and converts only the fp32 ones.
void gemm_operands(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                   const GemmOperand& A, const GemmOperand& B, float beta, float* C, int64_t ldc);
void gemm_bf16_operands(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                        const GemmOperand& A, const GemmOperand& B, float beta, float* C,
                        int64_t ldc);

// out[rows,C] += bias[C] (+ residual[rows,C] when not null).
void add_bias(float* out, const float* bias, const float* residual, int64_t rows, int64_t C);
// dbias[C] += column sums of dout[rows,C] (rows of stride ld; 0 = C).
void bias_backward(float* dbias, const float* dout, int64_t rows, int64_t C, int64_t ld = 0);
// out[i, 0:C) = values[0:C) for rows i of stride ld (a bias before a GEMM with beta = 1).
void fill_rows(float* out, int64_t ld, const float* values, int64_t rows, int64_t C);

// out[BT,OC] = inp[BT,IC] @ w[IC,OC] + bias[OC] (HF Conv1D layout; bias may be null). The model
// uses model/modules.h's Linear (either layout, fused pieces); these serve tests and benchmarks.
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

// RMSNorm (LLaMA): out = inp * rstd * weight, rstd = 1/sqrt(mean(inp^2) + eps) per row; saves
// rstd [rows].
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int64_t rows,
                     int64_t C, float eps);
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int64_t rows, int64_t C);

// Rotary position embedding, Hugging Face LLaMA convention (rotate_half): within each head of
// width hd the pairs (i, i + hd/2), i < hd/2, are rotated by angle pos * theta^(-2i/hd):
//   y[i] = x[i] cos - x[i+hd/2] sin,  y[i+hd/2] = x[i+hd/2] cos + x[i] sin.
// x holds `rows` rows of stride ld; the first n_heads*hd columns of each row are rotated in place.
// Row r is row (row0 + r) of a [B*T] batch, so its position is (row0 + r) % T, or pos[row0 + r]
// when pos [B*T] is given (positions restarting at each document of a packed row; each < T).
void rope_forward(float* x, int64_t ld, int64_t rows, int64_t row0, int64_t T, int64_t n_heads,
                  int64_t hd, float theta, const int32_t* pos = nullptr);
// In place: the gradient w.r.t. the un-rotated input (rotation by -angle).
void rope_backward(float* dx, int64_t ld, int64_t rows, int64_t row0, int64_t T, int64_t n_heads,
                   int64_t hd, float theta, const int32_t* pos = nullptr);

// GELU, tanh approximation (GPT-2's "gelu_new").
void gelu_forward(float* out, const float* inp, int64_t n);
void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n);
// The bias of the layer before GELU, fused into it (one pass instead of a bias fill and a GEMM
// that reads it back): inp[r, :] += bias (kept: it is what gelu_backward needs), out = GELU(inp).
void gelu_bias_forward(float* out, float* inp, const float* bias, int64_t rows, int64_t C);

// SwiGLU: out[r, j] = silu(gu[r, j]) * gu[r, F + j]; each row of gu is gate | up (width 2F).
void swiglu_forward(float* out, const float* gu, int64_t rows, int64_t F);
void swiglu_backward(float* dgu, const float* gu, const float* dout, int64_t rows, int64_t F);

// The MLP activation of a bf16 model, whose up projection's output is kept in bf16 as autocast
// keeps it: fp32 math on bf16 values. pre [rows, width]: the up GEMM's fp32 output; up = bf16(pre
// (+ bias, when not null)), kept for backward; out = bf16(act(up)), the activation of the rounded
// value (GELU: width C; SwiGLU: up = gate | up, width 2F, out width F). The backwards read the
// kept bf16 up and accumulate fp32 gradients.
void gelu_forward_bf16(uint16_t* out, uint16_t* up, const float* pre, const float* bias,
                       int64_t rows, int64_t C);
void gelu_backward_bf16(float* dinp, const uint16_t* inp, const float* dout, int64_t n);
void swiglu_forward_bf16(uint16_t* out, uint16_t* gu, const float* pre, int64_t rows, int64_t F);
void swiglu_backward_bf16(float* dgu, const uint16_t* gu, const float* dout, int64_t rows,
                          int64_t F);

// Inverted dropout with masks drawn from Philox4x32-10 (core/philox.h), a pure function of global
// indices (DESIGN invariant 6): element e of position t of global sequence s, with extra counter
// word x (the global query head in attention, else 0), is kept iff
//   word[e % 4] of Philox4x32-10(key, counter words (e / 4, t, s, x)) >= threshold,
//   threshold = floor(double(p) * 2^32),
// and a kept value is scaled by 1 / (1 - p) (computed in float). key = dropout_key(seed, step,
// layer, site). p = 0: no mask is drawn (the ops below are then never called on it).
struct Dropout {
  float p = 0.0f;
  uint64_t key = 0;
  int64_t seq0 = 0;   // global index of batch row 0's sequence
  int64_t head0 = 0;  // attention: global index of this call's head 0 (tensor parallelism)
};
// out[i, c] = in[i, c] * mask(e = c, t = r % T, s = seq0 + r / T) / (1 - p), r = row0 + i
// (+ residual[i, c] when not null), for rows i of `rows` rows of width C. out may be in. Its own
// backward: dropout(dx, dy, nullptr, ...) with the same arguments.
void dropout(float* out, const float* in, const float* residual, int64_t rows, int64_t row0,
             int64_t T, int64_t C, const Dropout& d);

// Multi-head attention with grouped-query heads. q: [B, Tq] rows of stride ldq holding H heads of
// hd; k, v: [B, Tk] rows of stride ldkv holding Hkv heads of hd each (they may be column slices of
// one fused q|k|v buffer). Query head h uses kv head h / (H / Hkv) (Hugging Face repeat_kv).
// causal: query i sees keys j <= i (needs Tq == Tk). key_len: null, or [B] counts of valid keys
// (keys j >= key_len[b] are masked out: padding). seg_start: null, or (causal only) [B, Tq] the
// first key each query sees, the start of its document in a packed row: query i sees keys
// [seg_start[b, i], i], a block-diagonal causal mask (non-decreasing along a row, each <= i).
// dropout.p > 0: attention dropout, out = (P o M / (1 - p)) V with M the mask of element e = key j,
// t = query i, s = dropout.seq0 + b, x = dropout.head0 + h (see Dropout); backward draws M again.
// tiles: the tiled kernel's blocks of query rows and of keys (results differ only by rounding
// across key block sizes; tests pass small ones to cross many block edges at small sizes); 0 =
// sized to the sequence (attention_tiles). query_len: null, or [B] counts of real query rows
// (rows i >= query_len[b] are padding: the tiled kernel writes 0 there, lse 0, and its backward
// skips them, so their gradients get nothing; the model passes its key lengths for self-attention,
// where padded rows feed nothing that is not masked or pooled away).
struct AttentionTiles {
  int64_t queries = 0, keys = 0;
};
struct AttentionShape {
  int64_t B, Tq, Tk, H, Hkv, hd;
  bool causal;
  const int32_t* key_len = nullptr;
  const int32_t* seg_start = nullptr;
  Dropout dropout = {};
  AttentionTiles tiles = {};
  const int32_t* query_len = nullptr;
};
// The tiled kernel's blocks for s: s.tiles where set; else 256 keys, and 64 query rows (the
// causal mask's skipped triangle, the FlashAttention-2 block) or, without a causal mask and for
// Tq <= 256, all Tq rows as one block (short sequences: fewer, larger GEMMs, each key read once).
AttentionTiles attention_tiles(const AttentionShape& s);
// The model's attention, FlashAttention-2's algorithm: blocks of queries against blocks of keys
// with an online softmax, so no Tq x Tk matrix is stored. out: [B, Tq, H*hd] contiguous; lse:
// [B, H, Tq], each row's logsumexp of its scaled scores, saved for backward.
void attention_forward(float* out, float* lse, const float* q, int64_t ldq, const float* k,
                       const float* v, int64_t ldkv, const AttentionShape& s);
// Recomputes each block's probabilities from lse; needs the forward's out (D = rowsum(dO o O)).
// dq (stride ldq), dk and dv (stride ldkv) accumulate.
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        int64_t ldq, const float* k, const float* v, int64_t ldkv, const float* out,
                        const float* lse, const AttentionShape& s);
// The same over q, k and v kept in bf16 (a bf16 model's q|k|v, as autocast keeps them): each
// head's rows widened to fp32 and the same algorithm, fp32 math throughout (out, lse and the
// gradients fp32).
void attention_forward_bf16(float* out, float* lse, const uint16_t* q, int64_t ldq,
                            const uint16_t* k, const uint16_t* v, int64_t ldkv,
                            const AttentionShape& s);
void attention_backward_bf16(float* dq, float* dk, float* dv, const float* dout,
                             const uint16_t* q, int64_t ldq, const uint16_t* k, const uint16_t* v,
                             int64_t ldkv, const float* out, const float* lse,
                             const AttentionShape& s);
// The same attention keeping the probabilities P [B, H, Tq, Tk] (the undropped ones) for
// backward, which reads them instead of recomputing: the kernel before the tiled one, kept as the
// reference the tests and bench/attention_bench compare it with (s.tiles and s.query_len are not
// used: it computes every row).
void attention_probs_forward(float* out, float* probs, const float* q, int64_t ldq, const float* k,
                             const float* v, int64_t ldkv, const AttentionShape& s);
void attention_probs_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                              int64_t ldq, const float* k, const float* v, int64_t ldkv,
                              const float* probs, const AttentionShape& s);

// Attention of new query positions over cached keys and values (incremental decoding), one
// rank. Sequence r's queries are rows [qrow[r], qrow[r + 1]) of q (stride ldq, H heads of hd);
// its keys and values start at k[r] and v[r], position j at k[r] + j * ldkv, kv head g at column
// g * hd. Causal: the i-th new query of sequence r sees keys [0, keys[r] + i + 1) (keys[r]:
// positions cached before its first new query; the new ones are already written). Otherwise
// (cross-attention) every query of r sees keys [0, keys[r]). out: [qrow[rows], H*hd].
// Each query is computed the same way whatever the other sequences hold.
struct CachedAttentionShape {
  int64_t rows, H, Hkv, hd, ldkv;
  const int64_t* qrow;
  const int32_t* keys;
  bool causal;
};
void attention_cached(float* out, const float* q, int64_t ldq, const float* const* k,
                      const float* const* v, const CachedAttentionShape& s);

// Causal multi-head attention on a fused qkv[B,T,3C] (q|k|v); out[B,T,C]; lse[B,H,T] is saved.
// GPT-2's case of the general functions above.
void attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t C,
                       int64_t H);
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int64_t B, int64_t T, int64_t C, int64_t H);

// Token embedding over a slice of the vocabulary (rows [vocab_start, vocab_start + vocab_rows)
// of the table are `wte`): out[i,:] = wte[tokens[i] - vocab_start,:], zero for tokens outside the
// slice. With the whole table (start 0) this is the plain lookup.
void embedding_forward(float* out, const int32_t* tokens, const float* wte, int64_t vocab_start,
                       int64_t vocab_rows, int64_t n, int64_t C);
void embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int64_t vocab_start,
                        int64_t vocab_rows, int64_t n, int64_t C);
// Position embedding of rows [row0, row0 + rows) of a [B*T, C] batch: out[i,:] +=
// wpe[(row0+i)%T,:], or wpe[pos[row0+i],:] when pos [B*T] is given (each < T).
void position_forward(float* out, const float* wpe, int64_t row0, int64_t rows, int64_t T,
                      int64_t C, const int32_t* pos = nullptr);
void position_backward(float* dwpe, const float* dout, int64_t row0, int64_t rows, int64_t T,
                       int64_t C, const int32_t* pos = nullptr);
// The same forwards over tables of bf16 bits (a bf16 model's bf16_embeddings), each element
// widened exactly, so they equal the fp32 ones over the tables rounded with to_bf16. Their
// backwards are the fp32 ones: they never read the table.
void embedding_forward_bf16(float* out, const int32_t* tokens, const uint16_t* wte,
                            int64_t vocab_start, int64_t vocab_rows, int64_t n, int64_t C);
void position_forward_bf16(float* out, const uint16_t* wpe, int64_t row0, int64_t rows, int64_t T,
                           int64_t C, const int32_t* pos = nullptr);

// Combines per-row statistics across ranks that each hold a slice of the vocabulary:
// combine(buf, n, is_max) reduces n doubles in place (max or sum). Empty = one rank holds all.
using RowCombine = std::function<void(double* buf, int64_t n, bool is_max)>;

// Cross-entropy over logits[BT, ld] whose columns are vocabulary ids
// [vocab_start, vocab_start + ld); only the first `valid` columns are real vocabulary (the rest is
// padding and never enters the loss). Writes per-row losses; returns their sum (double, in row
// order). When grad_scale != 0, overwrites logits with dlogits = grad_scale * (softmax - onehot),
// zero on padding columns. A negative target marks a padding row: loss 0, dlogits 0.
// label_smoothing e in [0, 1) is PyTorch's CrossEntropyLoss(label_smoothing = e) over the
// vocab_size true classes of all ranks together (0 = valid: this rank holds them all): loss =
// (1 - e) * (-log p_target) + e * mean_c(-log p_c), dlogits = grad_scale * (softmax -
// (1 - e) onehot - e / vocab_size); padding columns and rows stay out of it. e = 0 is the plain
// loss, bit for bit; e > 0 adds each row's logit sum to the combine of sums (3*BT doubles, not 2).
double cross_entropy(float* logits, float* losses, const int32_t* targets, int64_t BT,
                     int64_t valid, int64_t ld, int64_t vocab_start, float grad_scale,
                     const RowCombine& combine = {}, float label_smoothing = 0.0f,
                     int64_t vocab_size = 0);
// The same over logits kept in bf16 (a bf16 model's LM head output, as autocast keeps it): each
// row widened exactly, the same fp32/double math, and the gradient rounded once into the row
// (nearest even): the bits ops::to_bf16 gives the fp32 kernel's gradient of the widened logits.
double cross_entropy_bf16(uint16_t* logits, float* losses, const int32_t* targets, int64_t BT,
                          int64_t valid, int64_t ld, int64_t vocab_start, float grad_scale,
                          const RowCombine& combine = {}, float label_smoothing = 0.0f,
                          int64_t vocab_size = 0);

// y += x.
void accumulate(float* y, const float* x, int64_t n);
// x[0, n) = 0, split across threads (a single-threaded memset of GPT-2's gradients was ~25 ms).
void zero(float* x, int64_t n);
// x *= s.
void scale(float* x, float s, int64_t n);
// sum of squares in double.
double sum_squares(const float* x, int64_t n);

}  // namespace trellis::ops
