#pragma once
// The arithmetic peak of one core, measured at start-up by a short probe, so that MFU divides by
// what this machine can do rather than by a constant tuned on another one.
namespace trellis {

enum class DType : unsigned char;

// FLOP/s (x 1e9) one core reaches with independent fused multiply-adds of `dtype` at the widest
// vector width it has (fp32: AVX-512 or AVX2 FMA; bf16: AVX512-BF16 dot products, or the fp32 FMA
// rate where the CPU has none, since bf16 GEMMs then run as fp32 FMAs). Runs on the calling thread
// for about `seconds`.
double measure_peak_gflops_per_core(DType dtype, double seconds = 0.05);

// What that probe measured, for the MFU line: "measured bf16 dot-product peak", ….
const char* peak_name(DType dtype);

}  // namespace trellis
