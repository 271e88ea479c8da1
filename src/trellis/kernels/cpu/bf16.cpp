// bf16: conversions and the mixed-precision GEMM (bf16 operands, fp32 accumulation and output)
// through oneDNN's matmul primitive, which runs on AVX512-BF16 dot products.
#include <omp.h>

#include <algorithm>
#include <bit>
#include <map>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "trellis/core/error.h"
#include "trellis/kernels/cpu/bf16_lanes.h"
#include "trellis/kernels/cpu/gemm_split.h"
#include "trellis/kernels/isa.h"
#include "trellis/kernels/ops.h"

namespace trellis::ops {

namespace {
using simd::round_bf16;

constexpr int64_t kConvertChunk = 1 << 14;  // elements per OpenMP work item

// The stored rectangle of an operand: rows of `cols` elements at stride ld -> packed bf16.
void pack_bf16(uint16_t* out, const float* in, int64_t rows, int64_t cols, int64_t ld) {
  const bool parallel = !omp_in_parallel() && rows * cols >= 2 * kConvertChunk;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = in + r * ld;
    uint16_t* dst = out + r * cols;
    for (int64_t c = 0; c < cols; ++c) dst[c] = round_bf16(src[c]);
  }
}

// oneDNN matmul primitives, one per (shape, strides, alpha, beta), built once per thread: creating
// one costs far more than running a small GEMM.
struct MatmulKey {
  int64_t m, n, k, a0, a1, b0, b1, ldc;
  float alpha, beta;
  auto tie() const { return std::tie(m, n, k, a0, a1, b0, b1, ldc, alpha, beta); }
  bool operator<(const MatmulKey& o) const { return tie() < o.tie(); }
};

const dnnl::engine& engine() {
  static const dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

dnnl::matmul& matmul_for(const MatmulKey& key) {
  thread_local std::map<MatmulKey, dnnl::matmul> cache;
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  using dt = dnnl::memory::data_type;
  const dnnl::memory::desc a({key.m, key.k}, dt::bf16, {key.a0, key.a1});
  const dnnl::memory::desc b({key.k, key.n}, dt::bf16, {key.b0, key.b1});
  const dnnl::memory::desc c({key.m, key.n}, dt::f32, {key.ldc, 1});
  dnnl::primitive_attr attr;
  if (key.alpha != 1.0f) attr.set_output_scales(0, {key.alpha});
  if (key.beta != 0.0f) {
    dnnl::post_ops po;
    po.append_sum(key.beta);
    attr.set_post_ops(po);
  }
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attr, engine());
  return cache.emplace(key, dnnl::matmul(pd)).first->second;
}

// C[m,n] (row stride ldc) = alpha * A B + beta * C for packed bf16 operands given by their
// element strides (row, column) of the logical [m,k] and [k,n] matrices.
void matmul(int64_t m, int64_t n, int64_t k, const uint16_t* A, int64_t a0, int64_t a1,
            const uint16_t* B, int64_t b0, int64_t b1, float alpha, float beta, float* C,
            int64_t ldc) {
  dnnl::matmul& prim = matmul_for({m, n, k, a0, a1, b0, b1, ldc, alpha, beta});
  using dt = dnnl::memory::data_type;
  dnnl::memory a({{m, k}, dt::bf16, {a0, a1}}, engine(), const_cast<uint16_t*>(A));
  dnnl::memory b({{k, n}, dt::bf16, {b0, b1}}, engine(), const_cast<uint16_t*>(B));
  dnnl::memory c({{m, n}, dt::f32, {ldc, 1}}, engine(), C);
  thread_local dnnl::stream stream(engine());
  prim.execute(stream, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
  stream.wait();
}

struct Bf16Scratch {
  std::vector<uint16_t> a, b;
  std::vector<float> fa, fb;  // the emulation's operands: bf16 values held in fp32
};

float bf16_value(uint16_t bits) { return std::bit_cast<float>(uint32_t(bits) << 16); }

// An operand's stored rectangle (rows x cols at stride ld) as packed bf16: converted into
// scratch, or used in place when it is bf16 already and packed (a strided bf16 slice, such as one
// piece's columns of dy, is copied so oneDNN sees the same packed operand as when it converts).
const uint16_t* packed_bf16(std::vector<uint16_t>& scratch, const GemmOperand& x, int64_t rows,
                            int64_t cols) {
  if (x.bf16 && (x.ld == cols || rows == 1)) return x.bf16;
  scratch.resize(size_t(rows * cols));
  if (x.bf16) {
    for (int64_t r = 0; r < rows; ++r)
      std::copy_n(x.bf16 + r * x.ld, cols, scratch.data() + r * cols);
  } else {
    pack_bf16(scratch.data(), x.f32, rows, cols, x.ld);
  }
  return scratch.data();
}

// Without AVX-512 oneDNN has no bf16 matmul; the same arithmetic is an fp32 GEMM of the rounded
// operands (a product of two bf16 values is exact in fp32), so tests and tools still work there.
void gemm_bf16_emulated(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                        const GemmOperand& A, const GemmOperand& B, float beta, float* C,
                        int64_t ldc, Bf16Scratch& s) {
  auto rounded = [](std::vector<float>& out, const GemmOperand& in, int64_t rows, int64_t cols) {
    out.resize(size_t(rows * cols));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        out[size_t(r * cols + c)] = in.bf16 ? bf16_value(in.bf16[r * in.ld + c])
                                            : bf16_value(round_bf16(in.f32[r * in.ld + c]));
  };
  rounded(s.fa, A, trans_a ? K : M, trans_a ? M : K);
  rounded(s.fb, B, trans_b ? N : K, trans_b ? K : N);
  gemm(trans_a, trans_b, M, N, K, alpha, s.fa.data(), trans_a ? M : K, s.fb.data(), trans_b ? K : N,
       beta, C, ldc);
}

void check_one_precision(const GemmOperand& x) {
  TRELLIS_CHECK((x.f32 == nullptr) != (x.bf16 == nullptr),
                "a GEMM operand needs exactly one of fp32 and bf16 storage");
}
}  // namespace

void to_bf16(uint16_t* out, const float* in, int64_t n) { pack_bf16(out, in, 1, n, n); }

void from_bf16(float* out, const uint16_t* in, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = bf16_value(in[i]);
}

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
               int64_t ldc) {
  gemm_bf16_operands(trans_a, trans_b, M, N, K, alpha, {A, nullptr, lda}, {B, nullptr, ldb}, beta,
                     C, ldc);
}

void gemm_bf16_operands(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                        const GemmOperand& A, const GemmOperand& B, float beta, float* C,
                        int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) {  // oneDNN refuses empty reductions; C = beta * C
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
    return;
  }
  check_one_precision(A);
  check_one_precision(B);
  thread_local Bf16Scratch s;
  if (cpu_isa() < Isa::Avx512)
    return gemm_bf16_emulated(trans_a, trans_b, M, N, K, alpha, A, B, beta, C, ldc, s);
  // Round the fp32 operands once, packed: A's stored rectangle is [K, M] when transposed, B's
  // [N, K].
  const uint16_t* pa = packed_bf16(s.a, A, trans_a ? K : M, trans_a ? M : K);
  const uint16_t* pb = packed_bf16(s.b, B, trans_b ? N : K, trans_b ? K : N);
  // Strides of the logical [M,K] and [K,N] matrices in the packed buffers.
  const int64_t a0 = trans_a ? 1 : K, a1 = trans_a ? M : 1;
  const int64_t b0 = trans_b ? 1 : N, b1 = trans_b ? K : 1;

  // Threads share the work as in the fp32 gemm (gemm_split.h).
  std::vector<std::string> errors(static_cast<size_t>(omp_get_max_threads()));
  for_each_gemm_block(M, N, K, [&](int t, bool split_n, int64_t lo, int64_t hi) {
    try {
      if (split_n)
        matmul(M, hi - lo, K, pa, a0, a1, pb + lo * (trans_b ? K : 1), b0, b1, alpha, beta, C + lo,
               ldc);
      else
        matmul(hi - lo, N, K, pa + lo * (trans_a ? 1 : K), a0, a1, pb, b0, b1, alpha, beta,
               C + lo * ldc, ldc);
    } catch (const std::exception& e) {
      errors[size_t(t)] = e.what();
    }
  });
  for (const std::string& e : errors) TRELLIS_CHECK(e.empty(), "oneDNN bf16 matmul: {}", e);
}

}  // namespace trellis::ops
