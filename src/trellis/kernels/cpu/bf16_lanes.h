#pragma once
// bf16 bits <-> float lanes for the element-wise kernels that keep their tensors in bf16 (a bf16
// model's GEMM outputs): values are widened exactly, computed on in fp32 and rounded once on
// store, nearest even, as ops::to_bf16 rounds.
#include <cstdint>
#include <cstring>

#include "trellis/core/bf16.h"
#include "trellis/kernels/cpu/simd_math.h"

namespace trellis::simd {

// One value at a time: core/bf16.h's.
using trellis::round_bf16;
using trellis::widen_bf16;

using u8 = uint32_t __attribute__((vector_size(32)));
using h8 = uint16_t __attribute__((vector_size(16)));

inline f8 load8_bf16(const uint16_t* p) {
  h8 h;
  std::memcpy(&h, p, sizeof h);
  const u8 u = __builtin_convertvector(h, u8) << 16;
  f8 v;
  std::memcpy(&v, &u, sizeof v);
  return v;
}
inline void store8_bf16(uint16_t* p, f8 x) {
  u8 u;
  std::memcpy(&u, &x, sizeof u);
  const u8 rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const u8 nan = (u8)((u & 0x7fffffffu) > 0x7f800000u);
  const h8 h = __builtin_convertvector(nan ? (u >> 16) | 0x40u : rounded, h8);
  std::memcpy(p, &h, sizeof h);
}
// The first n (< 8) lanes; the rest are 0.
inline f8 load8_bf16_partial(const uint16_t* p, int64_t n) {
  f8 v = {};
  for (int64_t i = 0; i < n; ++i) v[i] = widen_bf16(p[i]);
  return v;
}
inline void store8_bf16_partial(uint16_t* p, f8 x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) p[i] = round_bf16(x[i]);
}

// 8 float lanes of either storage, so one kernel body serves fp32 and bf16 tensors: widened
// exactly on load, rounded once on store (an fp32 store keeps the value).
inline f8 load8_widened(const float* p) { return load8(p); }
inline f8 load8_widened(const uint16_t* p) { return load8_bf16(p); }
inline f8 load8_widened(const float* p, int64_t n) { return load8_partial(p, n); }
inline f8 load8_widened(const uint16_t* p, int64_t n) { return load8_bf16_partial(p, n); }
inline void store8_rounded(float* p, f8 x) { store8(p, x); }
inline void store8_rounded(uint16_t* p, f8 x) { store8_bf16(p, x); }
inline void store8_rounded(float* p, f8 x, int64_t n) { store8_partial(p, x, n); }
inline void store8_rounded(uint16_t* p, f8 x, int64_t n) { store8_bf16_partial(p, x, n); }

}  // namespace trellis::simd
