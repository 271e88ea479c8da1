#include "trellis/core/philox.h"

#include <cmath>

namespace trellis {

void Philox::round10(uint32_t ctr[4], uint32_t key[2]) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int r = 0; r < 10; ++r) {
    const uint64_t p0 = uint64_t(kM0) * ctr[0];
    const uint64_t p1 = uint64_t(kM1) * ctr[2];
    const uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0);
    const uint32_t hi1 = uint32_t(p1 >> 32), lo1 = uint32_t(p1);
    ctr[0] = hi1 ^ ctr[1] ^ key[0];
    ctr[1] = lo1;
    ctr[2] = hi0 ^ ctr[3] ^ key[1];
    ctr[3] = lo0;
    key[0] += kW0;
    key[1] += kW1;
  }
}

void Philox::block(uint64_t key, uint64_t counter, uint32_t out[4]) {
  uint32_t k[2] = {uint32_t(key), uint32_t(key >> 32)};
  out[0] = uint32_t(counter);
  out[1] = uint32_t(counter >> 32);
  out[2] = 0;
  out[3] = 0;
  round10(out, k);
}

uint64_t name_hash(std::string_view name) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

static uint64_t mix_key(uint64_t seed, uint64_t stream) {
  // splitmix64 finaliser so nearby seeds/streams give unrelated keys
  uint64_t z = seed * 0x9E3779B97F4A7C15ull ^ stream;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

float philox_normal(uint64_t seed, uint64_t stream, uint64_t index) {
  uint32_t w[4];
  Philox::block(mix_key(seed, stream), index, w);
  // Box-Muller on two 32-bit uniforms; u1 in (0, 1] so the log is finite.
  const double u1 = (double(w[0]) + 1.0) / 4294967296.0;
  const double u2 = double(w[1]) / 4294967296.0;
  return float(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}

double philox_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  uint32_t w[4];
  Philox::block(mix_key(seed, stream), index, w);
  return (double((uint64_t(w[0]) << 21) ^ (w[1] >> 11))) / 9007199254740992.0;
}

uint64_t splitmix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t dropout_key(uint64_t seed, uint64_t step, uint64_t layer, uint64_t site) {
  return splitmix64(splitmix64(splitmix64(seed) ^ step) ^ (layer * 16 + site));
}

}  // namespace trellis
