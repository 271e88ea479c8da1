#pragma once
// What both attention kernels (attention.cpp keeping the probabilities, attention_tiled.cpp
// keeping a logsumexp) agree on: the shape checks and which keys a query row sees. Causal and
// padding masks leave each query row a prefix of visible keys; document segments (seg_start) cut
// that prefix's front, so a row sees a range [first_key, visible_keys) of keys, and starts only
// grow along a row.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "trellis/core/error.h"
#include "trellis/kernels/ops.h"

namespace trellis::ops::detail {

inline void check_attention_shape(const AttentionShape& s) {
  TRELLIS_CHECK(s.Hkv > 0 && s.H % s.Hkv == 0, "attention: H={} is not a multiple of Hkv={}", s.H,
                s.Hkv);
  TRELLIS_CHECK(!s.causal || s.Tq == s.Tk, "attention: causal needs Tq == Tk (got {} and {})", s.Tq,
                s.Tk);
  for (int64_t b = 0; s.key_len && b < s.B; ++b)
    TRELLIS_CHECK(s.key_len[b] >= 1 && s.key_len[b] <= s.Tk,
                  "attention: key_len[{}] = {} is outside [1, {}]", b, s.key_len[b], s.Tk);
  for (int64_t b = 0; s.query_len && b < s.B; ++b)
    TRELLIS_CHECK(s.query_len[b] >= 0 && s.query_len[b] <= s.Tq,
                  "attention: query_len[{}] = {} is outside [0, {}]", b, s.query_len[b], s.Tq);
  TRELLIS_CHECK(!s.seg_start || (s.causal && !s.key_len),
                "attention: document segments need causal attention without key lengths");
  for (int64_t b = 0; s.seg_start && b < s.B; ++b)
    for (int64_t i = 0; i < s.Tq; ++i) {
      const int32_t st = s.seg_start[b * s.Tq + i];
      TRELLIS_CHECK(st >= 0 && st <= i && (i == 0 || st >= s.seg_start[b * s.Tq + i - 1]),
                    "attention: seg_start[{}, {}] = {} is not a non-decreasing start <= {}", b, i,
                    st, i);
    }
}

// The first key query i of batch row b sees: the start of its document (0 without segments).
inline int64_t first_key(const AttentionShape& s, int64_t b, int64_t i) {
  return s.seg_start ? s.seg_start[b * s.Tq + i] : 0;
}
// Keys [0, n) that batch row b can see at all; masked keys are then never read.
inline int64_t valid_keys(const AttentionShape& s, int64_t b) {
  return s.key_len ? s.key_len[b] : s.Tk;
}
// Query rows [0, n) of batch row b that are not padding.
inline int64_t query_rows(const AttentionShape& s, int64_t b) {
  return s.query_len ? s.query_len[b] : s.Tq;
}
// Keys the query rows before i1 see at all.
inline int64_t block_keys(const AttentionShape& s, int64_t b, int64_t i1) {
  return std::min(valid_keys(s, b), s.causal ? i1 : s.Tk);
}
// Keys [0, n) that query i of batch row b sees.
inline int64_t visible_keys(const AttentionShape& s, int64_t b, int64_t i) {
  return std::min(valid_keys(s, b), s.causal ? i + 1 : s.Tk);
}

// sum of a[j] * b[j], j < n, in 8 float lanes combined in a fixed order (a plain float loop is a
// serial chain of adds).
inline float dot_f8(const float* a, const float* b, int64_t n) {
  using f8 = float __attribute__((vector_size(32)));
  f8 acc = {};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    f8 x, y;
    std::memcpy(&x, a + j, sizeof x);
    std::memcpy(&y, b + j, sizeof y);
    acc += x * y;
  }
  float sum = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  for (; j < n; ++j) sum += a[j] * b[j];
  return sum;
}

}  // namespace trellis::ops::detail
