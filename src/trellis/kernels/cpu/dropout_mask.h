#pragma once
// The dropout mask of ops::Dropout (kernels/ops.h), shared by the dropout op and attention: the
// multipliers (0 or 1 / (1 - p)) of elements [e0, e0 + n) of one position.
#include <algorithm>
#include <cstdint>

#include "trellis/kernels/ops.h"

namespace trellis::ops {

// Elements below it are dropped: floor(p * 2^32) (p < 1, so it fits).
inline uint32_t dropout_threshold(float p) { return uint32_t(double(p) * 4294967296.0); }
inline float dropout_scale(float p) { return 1.0f / (1.0f - p); }

// m[k] = the multiplier of element e0 + k (k < n) at position t of sequence s, extra word x.
// Philox4x32-10 (core/philox's round10) on kLanes counters at once, written so the compiler
// vectorises the lanes (32 x 32 -> 64-bit products); the same words as one block at a time.
inline void dropout_multipliers(float* m, int64_t e0, int64_t n, const Dropout& d, uint64_t t,
                                uint64_t s, uint64_t x) {
  constexpr int kLanes = 16;
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  const uint32_t thr = dropout_threshold(d.p);
  const float scale = dropout_scale(d.p);
  const int64_t first_block = e0 >> 2, end_block = (e0 + n + 3) >> 2;
  for (int64_t b0 = first_block; b0 < end_block; b0 += kLanes) {
    uint32_t c0[kLanes], c1[kLanes], c2[kLanes], c3[kLanes];
    for (int l = 0; l < kLanes; ++l) {
      c0[l] = uint32_t(b0 + l);
      c1[l] = uint32_t(t);
      c2[l] = uint32_t(s);
      c3[l] = uint32_t(x);
    }
    uint32_t k0 = uint32_t(d.key), k1 = uint32_t(d.key >> 32);
    for (int r = 0; r < 10; ++r) {
      for (int l = 0; l < kLanes; ++l) {
        const uint64_t p0 = uint64_t(kM0) * c0[l], p1 = uint64_t(kM1) * c2[l];
        const uint32_t n0 = uint32_t(p1 >> 32) ^ c1[l] ^ k0, n2 = uint32_t(p0 >> 32) ^ c3[l] ^ k1;
        c1[l] = uint32_t(p1);
        c3[l] = uint32_t(p0);
        c0[l] = n0;
        c2[l] = n2;
      }
      k0 += kW0;
      k1 += kW1;
    }
    // Element e = 4 * block + word; keep those in [e0, e0 + n). The words are laid out in
    // element order first, so the threshold runs over a contiguous array (picking each element's
    // word from the four lanes in place took most of the time: gathers and blends).
    uint32_t words[4 * kLanes];
    for (int l = 0; l < kLanes; ++l) {
      words[4 * l] = c0[l];
      words[4 * l + 1] = c1[l];
      words[4 * l + 2] = c2[l];
      words[4 * l + 3] = c3[l];
    }
    const int64_t lo = std::max(e0, b0 * 4), hi = std::min(e0 + n, (b0 + kLanes) * 4);
    const uint32_t* word = words + (lo - b0 * 4);
    float* out = m + (lo - e0);
    for (int64_t k = 0; k < hi - lo; ++k) out[k] = word[k] >= thr ? scale : 0.0f;
  }
}

}  // namespace trellis::ops
