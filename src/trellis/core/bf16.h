#pragma once
// bf16 bits <-> float, one value at a time: what every bf16 conversion in trellis rounds like
// (the kernels' vector lanes, the communicator's bf16 sums).
#include <bit>
#include <cstdint>

namespace trellis {

// Round to nearest, ties to even; NaN stays a (quiet) NaN. Branch-free so loops vectorise; unlike
// vcvtneps2bf16 it keeps subnormals, as PyTorch's conversion does.
inline uint16_t round_bf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  return uint16_t(nan ? (u >> 16) | 0x40u : rounded);
}
inline float widen_bf16(uint16_t b) { return std::bit_cast<float>(uint32_t(b) << 16); }

}  // namespace trellis
