#pragma once
// The dropout mask of ops::Dropout (kernels/ops.h), shared by the dropout op and attention: the
// multipliers (0 or 1 / (1 - p)) of elements [e0, e0 + n) of one position.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "trellis/kernels/ops.h"

namespace trellis::ops {

// Elements below it are dropped: floor(p * 2^32) (p < 1, so it fits).
inline uint32_t dropout_threshold(float p) { return uint32_t(double(p) * 4294967296.0); }
inline float dropout_scale(float p) { return 1.0f / (1.0f - p); }

inline constexpr uint32_t kPhiloxM0 = 0xD2511F53u, kPhiloxM1 = 0xCD9E8D57u;
inline constexpr uint32_t kPhiloxW0 = 0x9E3779B9u, kPhiloxW1 = 0xBB67AE85u;

// The words of Philox4x32-10 (core/philox's round10) for the 16 blocks b0 .. b0 + 15 of counter
// (block, t, s, x), in element order: words[4 * l + w] = word w of block b0 + l.
inline void philox_words16(uint32_t words[64], uint32_t b0, uint32_t t, uint32_t s, uint32_t x,
                           uint64_t key) {
#if defined(__AVX2__)
  // Eight blocks per register, one per 32-bit lane. AVX2 multiplies the even lanes 32 x 32 ->
  // 64 bits (vpmuludq), so each product takes two: the even lanes and the odd ones shifted down.
  // (Plain loops over 16 lanes compiled to scalar imuls: 14% of a dropout-0.1 ViT step.)
  const __m256i m0 = _mm256_set1_epi32(int(kPhiloxM0)), m1 = _mm256_set1_epi32(int(kPhiloxM1));
  auto mulhilo = [](__m256i a, __m256i m, __m256i& lo, __m256i& hi) {
    const __m256i even = _mm256_mul_epu32(a, m);
    const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m);
    lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
    hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
  };
  for (int half = 0; half < 2; ++half) {
    __m256i c0 = _mm256_add_epi32(_mm256_set1_epi32(int(b0 + 8u * uint32_t(half))),
                                  _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256i c1 = _mm256_set1_epi32(int(t)), c2 = _mm256_set1_epi32(int(s));
    __m256i c3 = _mm256_set1_epi32(int(x));
    uint32_t k0 = uint32_t(key), k1 = uint32_t(key >> 32);
    for (int r = 0; r < 10; ++r) {
      __m256i lo0, hi0, lo1, hi1;
      mulhilo(c0, m0, lo0, hi0);
      mulhilo(c2, m1, lo1, hi1);
      c0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), _mm256_set1_epi32(int(k0)));
      c2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), _mm256_set1_epi32(int(k1)));
      c1 = lo1;
      c3 = lo0;
      k0 += kPhiloxW0;
      k1 += kPhiloxW1;
    }
    // Four registers of 8 lanes -> 8 blocks of 4 words, in block order.
    const __m256i t0 = _mm256_unpacklo_epi32(c0, c1), t1 = _mm256_unpackhi_epi32(c0, c1);
    const __m256i t2 = _mm256_unpacklo_epi32(c2, c3), t3 = _mm256_unpackhi_epi32(c2, c3);
    const __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
    const __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
    __m256i* out = reinterpret_cast<__m256i*>(words + 32 * half);
    _mm256_storeu_si256(out, _mm256_permute2x128_si256(u0, u1, 0x20));
    _mm256_storeu_si256(out + 1, _mm256_permute2x128_si256(u2, u3, 0x20));
    _mm256_storeu_si256(out + 2, _mm256_permute2x128_si256(u0, u1, 0x31));
    _mm256_storeu_si256(out + 3, _mm256_permute2x128_si256(u2, u3, 0x31));
  }
#else
  for (uint32_t l = 0; l < 16; ++l) {
    uint32_t c0 = b0 + l, c1 = t, c2 = s, c3 = x;
    uint32_t k0 = uint32_t(key), k1 = uint32_t(key >> 32);
    for (int r = 0; r < 10; ++r) {
      const uint64_t p0 = uint64_t(kPhiloxM0) * c0, p1 = uint64_t(kPhiloxM1) * c2;
      const uint32_t n0 = uint32_t(p1 >> 32) ^ c1 ^ k0, n2 = uint32_t(p0 >> 32) ^ c3 ^ k1;
      c1 = uint32_t(p1);
      c3 = uint32_t(p0);
      c0 = n0;
      c2 = n2;
      k0 += kPhiloxW0;
      k1 += kPhiloxW1;
    }
    words[4 * l] = c0;
    words[4 * l + 1] = c1;
    words[4 * l + 2] = c2;
    words[4 * l + 3] = c3;
  }
#endif
}

// m[k] = the multiplier of element e0 + k (k < n) at position t of sequence s, extra word x.
inline void dropout_multipliers(float* m, int64_t e0, int64_t n, const Dropout& d, uint64_t t,
                                uint64_t s, uint64_t x) {
  constexpr int kLanes = 16;
  const uint32_t thr = dropout_threshold(d.p);
  const float scale = dropout_scale(d.p);
  const int64_t first_block = e0 >> 2, end_block = (e0 + n + 3) >> 2;
  for (int64_t b0 = first_block; b0 < end_block; b0 += kLanes) {
    // Element e = 4 * block + word; keep those in [e0, e0 + n). The words are laid out in
    // element order first, so the threshold runs over a contiguous array (picking each element's
    // word from the four lanes in place took most of the time: gathers and blends).
    uint32_t words[4 * kLanes];
    philox_words16(words, uint32_t(b0), uint32_t(t), uint32_t(s), uint32_t(x), d.key);
    const int64_t lo = std::max(e0, b0 * 4), hi = std::min(e0 + n, (b0 + kLanes) * 4);
    const uint32_t* word = words + (lo - b0 * 4);
    float* out = m + (lo - e0);
    for (int64_t k = 0; k < hi - lo; ++k) out[k] = word[k] >= thr ? scale : 0.0f;
  }
}

}  // namespace trellis::ops
