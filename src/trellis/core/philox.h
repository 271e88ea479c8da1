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

// splitmix64's finaliser of z + 0x9E3779B97F4A7C15 (Steele et al. 2014), all mod 2^64.
uint64_t splitmix64(uint64_t z);
// The Philox key of one dropout site's masks (DESIGN invariant 6; docs/training.md "Dropout"):
//   splitmix64(splitmix64(splitmix64(seed) ^ step) ^ (layer * 16 + site)).
// The rank and the layout do not enter: a mask element is then addressed by its global
// (sequence, position, element) in the counter (kernels/ops.h, ops::Dropout).
uint64_t dropout_key(uint64_t seed, uint64_t step, uint64_t layer, uint64_t site);

}  // namespace trellis
