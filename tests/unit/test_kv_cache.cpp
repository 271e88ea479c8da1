// model/kv_cache: incremental decoding's logits equal the full forward's at the same position
// (GPT-2, LLaMA with GQA and RoPE, the encoder-decoder), for rows of different lengths decoded
// together, prompts appended in one call, and rows reordered, copied and dropped as beam search
// does.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "trellis/core/bf16.h"
#include "trellis/core/error.h"
#include "trellis/model/config.h"
#include "trellis/model/model_chunk.h"
#include "trellis/model/params.h"
#include "trellis/tensor_parallel/operators.h"

namespace trellis {
namespace {

constexpr int kVocab = 61;

struct Model {
  explicit Model(const std::string& preset, DType compute = DType::F32,
                 bool bf16_embeddings = false)
      : cfg([&] {
          ModelConfig c = model_preset(preset);
          c.vocab_size = kVocab;
          c.bf16_embeddings = bf16_embeddings;
          c.validate();
          return c;
        }()),
        layout(cfg),
        params(layout.size()),
        model(layout, params.data(), nullptr, tp, nullptr, compute) {
    init_params(layout, 11, params.data());
    // Larger weights than the init's: sharper distributions, whose argmax means something.
    for (float& p : params) p *= 4.0f;
  }
  ModelConfig cfg;
  ParamLayout layout;
  std::vector<float> params;
  TensorParallel tp{nullptr, false};
  ModelChunk model;
};

// The logits of the full (uncached) forward at the last position of `seq` (a decoder-only model),
// or of the decoder's input `seq` over `source` (an encoder-decoder, padded as decode.cpp does).
std::vector<float> full_logits(Model& m, const std::vector<int32_t>& seq,
                               const std::vector<uint32_t>& source = {}) {
  const int64_t n = int64_t(seq.size());
  const int64_t T = std::max<int64_t>(n, int64_t(source.size()) + 1);
  Context ctx;
  m.model.prepare(ctx, 1, T);
  std::fill(ctx.tokens.begin(), ctx.tokens.end(), kVocab - 1);
  std::copy(seq.begin(), seq.end(), ctx.tokens.begin());
  if (m.cfg.encoder_decoder()) {
    ctx.src_tokens.assign(size_t(T), kVocab - 1);
    std::copy(source.begin(), source.end(), ctx.src_tokens.begin());
    ctx.lengths = {int32_t(source.size() + 1)};
  }
  return m.model.logits_at(ctx, {n - 1});
}

// Row r of the cache's logits against the full forward; returns its argmax.
int expect_row(Model& m, const KVCache& cache, int64_t r, const std::vector<int32_t>& seq,
               const std::vector<uint32_t>& source = {}) {
  const std::vector<float> want = full_logits(m, seq, source);
  const float* got = cache.work.logits.data() + r * kVocab;
  float scale = 1.0f, diff = 0.0f;
  for (int v = 0; v < kVocab; ++v) {
    scale = std::max(scale, std::abs(want[size_t(v)]));
    diff = std::max(diff, std::abs(got[v] - want[size_t(v)]));
  }
  EXPECT_LE(diff, 1e-5f * scale) << "row " << r << " at length " << seq.size();
  const int best = int(std::max_element(got, got + kVocab) - got);
  EXPECT_EQ(best, int(std::max_element(want.begin(), want.end()) - want.begin()));
  return best;
}

std::vector<int32_t> tokens(int n, int salt) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(int32_t((i * 17 + salt * 29 + 3) % (kVocab - 1)));
  return t;
}

std::vector<std::span<const int32_t>> spans(const std::vector<std::vector<int32_t>>& rows) {
  return {rows.begin(), rows.end()};
}

class DecoderOnly : public ::testing::TestWithParam<std::string> {};

TEST_P(DecoderOnly, CachedLogitsEqualTheFullForward) {
  Model m(GetParam());
  // Prompts of different lengths, appended in one call, then greedy steps of one token.
  std::vector<std::vector<int32_t>> seq = {tokens(5, 1), tokens(1, 2), tokens(9, 3)};
  KVCache cache = m.model.start_cache(3, 24);
  m.model.decode(cache, spans(seq));
  std::vector<std::vector<int32_t>> step(3);
  auto advance = [&](int steps) {
    for (int s = 0; s < steps; ++s) {
      for (int64_t r = 0; r < cache.size(); ++r) {
        step[size_t(r)] = {expect_row(m, cache, r, seq[size_t(r)])};
        seq[size_t(r)].push_back(step[size_t(r)][0]);
      }
      m.model.decode(cache, spans(step));
    }
  };
  advance(6);
  // Beam search's bookkeeping: row 2 first, row 0 twice (its copy diverges), row 1 leaves.
  cache.select({2, 0, 0});
  seq = {seq[2], seq[0], seq[0]};
  step = {{5}, {7}, {9}};
  for (int64_t r = 0; r < 3; ++r) seq[size_t(r)].push_back(step[size_t(r)][0]);
  m.model.decode(cache, spans(step));
  // Several tokens for some rows and one for another, as a prompt continues.
  step = {{1, 2, 3}, {4}, {6, 8}};
  for (int64_t r = 0; r < 3; ++r)
    seq[size_t(r)].insert(seq[size_t(r)].end(), step[size_t(r)].begin(), step[size_t(r)].end());
  m.model.decode(cache, spans(step));
  advance(2);
  for (int64_t r = 0; r < 3; ++r) expect_row(m, cache, r, seq[size_t(r)]);
  // Beyond the cache's capacity: an input error, not a write past the end.
  std::vector<std::vector<int32_t>> too_many(3, tokens(10, 4));
  EXPECT_THROW(m.model.decode(cache, spans(too_many)), Error);
}

INSTANTIATE_TEST_SUITE_P(Families, DecoderOnly, ::testing::Values("tiny", "llama-tiny"));

TEST(EncoderDecoder, CachedLogitsEqualTheFullForward) {
  Model m("encdec-tiny");
  const int32_t end = kVocab - 1;
  std::vector<std::vector<uint32_t>> src;
  for (int n : {3, 7, 1}) {
    const std::vector<int32_t> t = tokens(n, n);
    src.emplace_back(t.begin(), t.end());
  }
  const std::vector<std::span<const uint32_t>> sources(src.begin(), src.end());
  KVCache cache = m.model.encode(sources, 12, end);
  std::vector<std::vector<int32_t>> seq(3, {end});
  std::vector<std::vector<int32_t>> step = seq;
  std::vector<size_t> of = {0, 1, 2};  // each row's source
  auto advance = [&](int steps) {
    for (int s = 0; s < steps; ++s) {
      m.model.decode(cache, spans(step));
      for (int64_t r = 0; r < cache.size(); ++r) {
        step[size_t(r)] = {expect_row(m, cache, r, seq[size_t(r)], src[of[size_t(r)]])};
        seq[size_t(r)].push_back(step[size_t(r)][0]);
      }
    }
  };
  advance(4);
  cache.select({1, 1, 2});  // source 0's hypothesis leaves, source 1's is copied
  seq = {seq[1], seq[1], seq[2]};
  step = {step[1], {3}, step[2]};
  seq[1].back() = 3;
  of = {1, 1, 2};
  advance(4);
}

// A bf16 model's head output is bf16 (autocast's linear output) on every path: the training/eval
// forward keeps the logits in bf16 (Context::logits_or_grad), and logits_at (sampling, uncached
// decoding) and the KV cache's decode (sampling, beam search) return values rounded to bf16, so
// they see what the loss sees; logits_at's are within one bf16 rounding of the forward's at the
// same position (the two head GEMMs differ in shape only, hence in fp32 summation order).
TEST(Bf16, HeadOutputIsBf16OnEveryPath) {
  auto is_bf16 = [](float x) { return (std::bit_cast<uint32_t>(x) & 0xffffu) == 0; };
  for (const std::string preset : {"tiny", "llama-tiny", "encdec-tiny"}) {
    SCOPED_TRACE(preset);
    Model m(preset, DType::BF16);
    const bool encdec = m.cfg.encoder_decoder();
    const std::vector<int32_t> seq = tokens(7, 1);
    const std::vector<int32_t> src_t = tokens(5, 2);
    const std::vector<uint32_t> source(src_t.begin(), src_t.end());
    const std::vector<float> at = full_logits(m, seq, encdec ? source : std::vector<uint32_t>{});
    // The forward over the same batch, as full_logits builds it.
    const int64_t n = int64_t(seq.size()), T = encdec ? std::max<int64_t>(n, 6) : n;
    Context ctx;
    m.model.prepare(ctx, 1, T);
    std::fill(ctx.tokens.begin(), ctx.tokens.end(), kVocab - 1);
    std::copy(seq.begin(), seq.end(), ctx.tokens.begin());
    std::fill(ctx.targets.begin(), ctx.targets.end(), 0);
    if (encdec) {
      ctx.src_tokens.assign(size_t(T), kVocab - 1);
      std::copy(source.begin(), source.end(), ctx.src_tokens.begin());
      ctx.lengths = {int32_t(source.size() + 1)};
    }
    m.model.forward(ctx, 0.0f);
    ASSERT_EQ(ctx.logits_or_grad.dtype(), DType::BF16);
    const int64_t ld = ctx.logits_or_grad.dim(1);
    const uint16_t* kept = ctx.logits_or_grad.bf16() + (n - 1) * ld;
    int differ = 0;
    for (int v = 0; v < kVocab; ++v) {
      const float want = std::bit_cast<float>(uint32_t(kept[v]) << 16), got = at[size_t(v)];
      EXPECT_TRUE(is_bf16(got)) << "logits_at[" << v << "] = " << got << " is not a bf16 value";
      EXPECT_LE(std::abs(got - want), std::ldexp(std::abs(want), -8)) << "logit " << v;
      differ += got != want;
    }
    EXPECT_LE(differ, kVocab / 8);  // one-ulp flips are rare
    // Cached decoding of the same sequence: bf16 values too.
    KVCache cache = encdec ? m.model.encode({std::span<const uint32_t>(source)}, 12, kVocab - 1)
                           : m.model.start_cache(1, 12);
    const std::vector<std::vector<int32_t>> rows = {seq};
    const std::vector<float>& got = m.model.decode(cache, spans(rows));
    ASSERT_EQ(got.size(), size_t(kVocab));
    for (int v = 0; v < kVocab; ++v)
      EXPECT_TRUE(is_bf16(got[size_t(v)])) << "decode's logit " << v << " = " << got[size_t(v)];
  }
}

// bf16_embeddings on the cached paths (encode, decode): a bf16 model with the key gives, bit for
// bit, the logits of the model without it whose tables hold their bf16 values (rounding those
// again changes nothing, and no GEMM reads them otherwise), and not those of the plain model.
TEST(Bf16, CachedDecodingLooksTheTablesUpInBf16) {
  for (const std::string preset : {"tiny", "llama-tiny", "encdec-tiny"}) {
    SCOPED_TRACE(preset);
    Model keyed(preset, DType::BF16, true), plain(preset, DType::BF16),
        rounded(preset, DType::BF16);
    int tables = 0;
    for (const ParamSpec& s : rounded.layout.specs()) {
      if (s.slot != Slot::TokEmbed && s.slot != Slot::PosEmbed && s.slot != Slot::DecPosEmbed)
        continue;
      ++tables;
      for (float& w : std::span(rounded.params.data() + s.offset, s.numel()))
        w = widen_bf16(round_bf16(w));
    }
    EXPECT_EQ(tables, preset == "tiny" ? 2 : preset == "llama-tiny" ? 1 : 3);
    const std::vector<int32_t> src_t = tokens(5, 2);
    const std::vector<uint32_t> source(src_t.begin(), src_t.end());
    const std::vector<std::vector<int32_t>> rows = {tokens(7, 1)}, next = {{4}};
    auto logits = [&](Model& m) {
      KVCache cache = keyed.cfg.encoder_decoder()
                          ? m.model.encode({std::span<const uint32_t>(source)}, 12, kVocab - 1)
                          : m.model.start_cache(1, 12);
      std::vector<float> out = m.model.decode(cache, spans(rows));
      const std::vector<float>& more = m.model.decode(cache, spans(next));
      out.insert(out.end(), more.begin(), more.end());
      return out;
    };
    const std::vector<float> got = logits(keyed);
    EXPECT_EQ(got, logits(rounded));
    EXPECT_NE(got, logits(plain));
  }
}

}  // namespace
}  // namespace trellis
