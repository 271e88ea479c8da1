#pragma once
// Counter-based RNG (Philox4x32-10, Salmon et al. 2011). Any element of any parameter can be
// generated on its own, so every layout/shard draws exactly the same global weights.
#include <cstdint>
#include <string_view>

namespace trellis {

struct Philox {
  static void round10(uint32_t ctr[4], uint32_t key[2]);

  // Four independent 32-bit words for (key, counter).
  static void block(uint64_t key, uint64_t counter, uint32_t out[4]);
};

// Stable 64-bit FNV-1a hash of a parameter name (the RNG stream per name).
uint64_t name_hash(std::string_view name);

// Standard normal for element `index` of the stream (seed, name).
float philox_normal(uint64_t seed, uint64_t stream, uint64_t index);
// Uniform in [0, 1) for element `index` of the stream (seed, stream).
double philox_uniform(uint64_t seed, uint64_t stream, uint64_t index);

}  // namespace trellis
