// Dropout (kernels/ops.h ops::Dropout, DESIGN invariant 6): the mask of an element is the Philox
// word its global indices address, so any slice of rows, sequences or heads draws exactly the
// masks the whole batch draws there. The PyTorch oracle (tests/reference/
// test_torch_oracle_dropout.py) checks the gradients; these check the addressing.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "trellis/core/philox.h"
#include "trellis/kernels/cpu/dropout_mask.h"
#include "trellis/kernels/ops.h"

namespace trellis {
namespace {

std::vector<float> random_vec(size_t n, unsigned seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

// The documented formula, restated: word e % 4 of Philox(key, (e / 4, t, s, x)) >= p * 2^32.
bool kept(const ops::Dropout& d, uint64_t e, uint64_t t, uint64_t s, uint64_t x) {
  uint32_t ctr[4] = {uint32_t(e / 4), uint32_t(t), uint32_t(s), uint32_t(x)};
  uint32_t key[2] = {uint32_t(d.key), uint32_t(d.key >> 32)};
  Philox::round10(ctr, key);
  return ctr[e % 4] >= uint32_t(double(d.p) * 4294967296.0);
}

TEST(Dropout, KeyMixesSeedStepLayerSite) {
  EXPECT_EQ(splitmix64(0), 0xE220A8397B1DCDAFull);  // splitmix64's first output from state 0
  const uint64_t k = dropout_key(1, 2, 3, 4);
  EXPECT_EQ(k, splitmix64(splitmix64(splitmix64(1) ^ 2) ^ (3 * 16 + 4)));
  EXPECT_NE(k, dropout_key(1, 2, 3, 5));
  EXPECT_NE(k, dropout_key(1, 2, 4, 4));
  EXPECT_NE(k, dropout_key(1, 3, 3, 4));
  EXPECT_NE(k, dropout_key(2, 2, 3, 4));
}

TEST(Dropout, EachElementIsItsGlobalIndicesPhiloxWord) {
  const int64_t T = 5, C = 11, rows = 3 * T;
  const ops::Dropout d{0.3f, dropout_key(7, 9, 1, 3), 40, 0};
  const std::vector<float> x = random_vec(size_t(rows * C), 1), res = random_vec(x.size(), 2);
  std::vector<float> y(x.size()), z(x.size());
  ops::dropout(y.data(), x.data(), nullptr, rows, 0, T, C, d);
  ops::dropout(z.data(), x.data(), res.data(), rows, 0, T, C, d);
  int64_t dropped = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < C; ++c) {
      const size_t i = size_t(r * C + c);
      const bool k = kept(d, uint64_t(c), uint64_t(r % T), uint64_t(40 + r / T), 0);
      dropped += !k;
      EXPECT_EQ(y[i], k ? x[i] * (1.0f / 0.7f) : 0.0f) << r << "," << c;
      EXPECT_FLOAT_EQ(z[i], y[i] + res[i]);
    }
  EXPECT_GT(dropped, 0);
  EXPECT_LT(dropped, rows * C);
}

TEST(Dropout, MultipliersOfAnyElementRangeAreTheirPhiloxWords) {
  // Ranges that start and end inside a block of four words and inside a group of 16 blocks, span
  // several groups, and counters past 2^31 (signed lanes would differ there).
  const ops::Dropout d{0.25f, dropout_key(3, 5, 2, 1), 0, 0};
  const int64_t ranges[][2] = {{0, 1}, {0, 64}, {3, 150}, {61, 7}, {64, 77}, {1000, 333}};
  for (const auto& [e0, n] : ranges)
    for (const uint64_t s : {uint64_t(6), uint64_t(0x9000'0000)}) {
      std::vector<float> m(size_t(n), -1.0f);
      ops::dropout_multipliers(m.data(), e0, n, d, 17, s, 2);
      for (int64_t k = 0; k < n; ++k)
        ASSERT_EQ(m[size_t(k)], kept(d, uint64_t(e0 + k), 17, s, 2) ? 1.0f / 0.75f : 0.0f)
            << e0 << "+" << k << " s=" << s;
    }
  // Element counters past 2^31 as well.
  std::vector<float> m(40);
  ops::dropout_multipliers(m.data(), int64_t(0x8000'0000) * 4 - 20, 40, d, 1, 1, 0);
  for (int64_t k = 0; k < 40; ++k)
    ASSERT_EQ(m[size_t(k)], kept(d, uint64_t(0x8000'0000) * 4 - 20 + uint64_t(k), 1, 1, 0)
                                ? 1.0f / 0.75f
                                : 0.0f);
}

TEST(Dropout, KeepsAboutOneMinusP) {
  const int64_t T = 64, C = 256;
  const ops::Dropout d{0.25f, dropout_key(1, 0, 0, 0), 0, 0};
  std::vector<float> x(size_t(T * C), 1.0f);
  ops::dropout(x.data(), x.data(), nullptr, T, 0, T, C, d);
  int64_t kept_n = 0;
  for (float v : x) {
    ASSERT_TRUE(v == 0.0f || v == 1.0f / 0.75f) << v;
    kept_n += v != 0.0f;
  }
  EXPECT_NEAR(double(kept_n) / double(T * C), 0.75, 0.01);
}

// Sequence parallelism: a rank's rows are an offset slice of the B*T rows.
TEST(Dropout, RowSlicesDrawTheWholeBatchsMasks) {
  const int64_t T = 6, C = 9, rows = 4 * T;
  const ops::Dropout d{0.5f, dropout_key(3, 1, 2, 6), 8, 0};
  const std::vector<float> x = random_vec(size_t(rows * C), 3);
  std::vector<float> whole(x.size()), parts(x.size());
  ops::dropout(whole.data(), x.data(), nullptr, rows, 0, T, C, d);
  for (int64_t r0 : {int64_t(0), int64_t(7), int64_t(13)}) {  // slices not on sequence bounds
    const int64_t r1 = r0 == 0 ? 7 : r0 == 7 ? 13 : rows;
    ops::dropout(parts.data() + r0 * C, x.data() + r0 * C, nullptr, r1 - r0, r0, T, C, d);
  }
  EXPECT_EQ(whole, parts);
}

// Tensor parallelism splits heads (head0) and data parallelism / micro-batches the sequences
// (seq0): each slice draws the masks of the whole call, so outputs and gradients are bitwise.
TEST(AttentionDropout, HeadAndSequenceSlicesDrawTheWholeCallsMasks) {
  for (bool causal : {true, false}) {
    const int64_t B = 2, T = 7, H = 4, hd = 3, C = H * hd;
    const ops::Dropout drop{0.4f, dropout_key(5, 2, 1, 2), 10, 0};
    const std::vector<float> q = random_vec(size_t(B * T * C), 4), k = random_vec(q.size(), 5),
                             v = random_vec(q.size(), 6), dout = random_vec(q.size(), 7);
    ops::AttentionShape whole{B, T, T, H, H, hd, causal};
    whole.dropout = drop;
    std::vector<float> out(q.size()), lse(size_t(B * H * T));
    std::vector<float> dq(q.size()), dk(q.size()), dv(q.size());
    ops::attention_forward(out.data(), lse.data(), q.data(), C, k.data(), v.data(), C, whole);
    ops::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), C, k.data(),
                            v.data(), C, out.data(), lse.data(), whole);
    // Without dropout the output differs: the mask is there.
    ops::AttentionShape plain = whole;
    plain.dropout = {};
    std::vector<float> out0(q.size()), lse0(lse.size());
    ops::attention_forward(out0.data(), lse0.data(), q.data(), C, k.data(), v.data(), C, plain);
    EXPECT_EQ(lse0, lse);  // the kept logsumexp is the undropped probabilities' one
    EXPECT_NE(out0, out);
    // Heads [2, 4) of each sequence as their own call (head0 = 2), and each sequence alone
    // (seq0 = 10 + b); the pieces land in the same places.
    std::vector<float> out_h(q.size()), dq_h(q.size()), dk_h(q.size()), dv_h(q.size());
    std::vector<float> lse_h(size_t(B * 2 * T));
    for (int64_t h0 : {0, 2}) {
      ops::AttentionShape half{B, T, T, 2, 2, hd, causal};
      half.dropout = drop;
      half.dropout.head0 = h0;
      const int64_t off = h0 * hd;
      // out is [B, T, 2*hd] contiguous for the call: compute into scratch and scatter.
      std::vector<float> o(size_t(B * T * 2 * hd));
      ops::attention_forward(o.data(), lse_h.data(), q.data() + off, C, k.data() + off,
                             v.data() + off, C, half);
      std::vector<float> dy(o.size());
      for (int64_t r = 0; r < B * T; ++r)
        for (int64_t c = 0; c < 2 * hd; ++c) {
          out_h[size_t(r * C + off + c)] = o[size_t(r * 2 * hd + c)];
          dy[size_t(r * 2 * hd + c)] = dout[size_t(r * C + off + c)];
        }
      ops::attention_backward(dq_h.data() + off, dk_h.data() + off, dv_h.data() + off, dy.data(),
                              q.data() + off, C, k.data() + off, v.data() + off, C, o.data(),
                              lse_h.data(), half);
    }
    EXPECT_EQ(out_h, out) << "causal " << causal;
    EXPECT_EQ(dq_h, dq);
    EXPECT_EQ(dk_h, dk);
    EXPECT_EQ(dv_h, dv);
    std::vector<float> out_b(q.size()), dq_b(q.size()), dk_b(q.size()), dv_b(q.size());
    std::vector<float> lse_b(size_t(H * T));
    for (int64_t b = 0; b < B; ++b) {
      ops::AttentionShape one{1, T, T, H, H, hd, causal};
      one.dropout = drop;
      one.dropout.seq0 = drop.seq0 + b;
      const int64_t off = b * T * C;
      ops::attention_forward(out_b.data() + off, lse_b.data(), q.data() + off, C, k.data() + off,
                             v.data() + off, C, one);
      ops::attention_backward(dq_b.data() + off, dk_b.data() + off, dv_b.data() + off,
                              dout.data() + off, q.data() + off, C, k.data() + off, v.data() + off,
                              C, out_b.data() + off, lse_b.data(), one);
    }
    EXPECT_EQ(out_b, out);
    EXPECT_EQ(dq_b, dq);
    EXPECT_EQ(dk_b, dk);
    EXPECT_EQ(dv_b, dv);
  }
}

}  // namespace
}  // namespace trellis
