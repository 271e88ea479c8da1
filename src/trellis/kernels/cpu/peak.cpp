// Peak probes: chains of independent vector FMAs (enough of them to cover the FMA latency on
// every port), timed on one thread. The binary targets x86-64-v3 (AVX2 + FMA); the AVX-512
// variants are compiled for their ISA and chosen at run time.
#include "trellis/kernels/peak.h"

#include <immintrin.h>

#include <chrono>

#include "trellis/core/tensor.h"
#include "trellis/kernels/isa.h"

namespace trellis {

namespace {

// Independent accumulator chains: more than latency x ports of current x86 cores (4 x 2 for FMA;
// bf16 dot products have longer latencies), within the 16 ymm / 32 zmm registers.
constexpr int kChains = 12, kChains512 = 24;

using Clock = std::chrono::steady_clock;

// Runs body(iterations) until `seconds` have passed (after a warm-up that lets the clock ramp)
// and returns FLOP/s given flops_per_iteration.
template <class Body>
double rate(Body body, double flops_per_iteration, double seconds) {
  int64_t n = 1 << 12;
  body(n);  // warm-up
  for (;;) {
    const auto t0 = Clock::now();
    body(n);
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    if (dt >= seconds) return double(n) * flops_per_iteration / dt;
    n *= dt > 0.0 && seconds / dt < 16.0 ? 2 : 8;
  }
}

volatile float g_sink;  // keeps the chains' results alive

__attribute__((target("avx2,fma"))) void fma_avx2(int64_t n) {
  __m256 acc[kChains];
  for (int j = 0; j < kChains; ++j) acc[j] = _mm256_set1_ps(float(j));
  const __m256 b = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-6f);
  for (int64_t i = 0; i < n; ++i)
#pragma GCC unroll 32  // the chains must live in registers
    for (int j = 0; j < kChains; ++j) acc[j] = _mm256_fmadd_ps(acc[j], b, c);
  __m256 s = acc[0];
  for (int j = 1; j < kChains; ++j) s = _mm256_add_ps(s, acc[j]);
  g_sink = _mm256_cvtss_f32(s);
}

__attribute__((target("avx512f"))) void fma_avx512(int64_t n) {
  __m512 acc[kChains512];
  for (int j = 0; j < kChains512; ++j) acc[j] = _mm512_set1_ps(float(j));
  const __m512 b = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-6f);
  for (int64_t i = 0; i < n; ++i)
#pragma GCC unroll 32  // the chains must live in registers
    for (int j = 0; j < kChains512; ++j) acc[j] = _mm512_fmadd_ps(acc[j], b, c);
  // Every chain feeds the result, or the compiler drops the unused ones.
  __m512 s = acc[0];
  for (int j = 1; j < kChains512; ++j) s = _mm512_add_ps(s, acc[j]);
  g_sink = _mm512_reduce_add_ps(s);
}

// vdpbf16ps: 16 fp32 lanes, each += two bf16 products (4 FLOP per lane).
__attribute__((target("avx512f,avx512bf16"))) void dot_bf16(int64_t n) {
  __m512 acc[kChains512];
  for (int j = 0; j < kChains512; ++j) acc[j] = _mm512_set1_ps(float(j));
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3c00);
  for (int64_t i = 0; i < n; ++i)
#pragma GCC unroll 32  // the chains must live in registers
    for (int j = 0; j < kChains512; ++j) acc[j] = _mm512_dpbf16_ps(acc[j], a, b);
  __m512 s = acc[0];
  for (int j = 1; j < kChains512; ++j) s = _mm512_add_ps(s, acc[j]);
  g_sink = _mm512_reduce_add_ps(s);
}

}  // namespace

double measure_peak_gflops_per_core(DType dtype, double seconds) {
  const Isa isa = cpu_isa();  // honours TRELLIS_ISA
  if (dtype == DType::BF16 && isa >= Isa::Avx512Bf16)
    return rate(dot_bf16, kChains512 * 16 * 4, seconds) / 1e9;
  if (isa >= Isa::Avx512) return rate(fma_avx512, kChains512 * 16 * 2, seconds) / 1e9;
  return rate(fma_avx2, kChains * 8 * 2, seconds) / 1e9;
}

const char* peak_name(DType dtype) {
  if (dtype != DType::BF16) return "measured fp32 FMA peak";
  return cpu_isa() >= Isa::Avx512Bf16 ? "measured bf16 dot-product peak"
                                      : "measured fp32 FMA peak, bf16 GEMMs emulated";
}

}  // namespace trellis
