// Incremental decoding: the key/value cache and the ModelChunk's cached forward over new
// positions (model/kv_cache.h). The same modules and kernels as the full forward, over the new
// positions only; attention reads the cached keys and values (ops::attention_cached).
#include "trellis/model/kv_cache.h"

#include <algorithm>

#include "trellis/core/error.h"
#include "trellis/model/model_chunk.h"

namespace trellis {

void KVCache::select(const std::vector<int64_t>& from) {
  std::vector<Row> next(from.size());
  std::vector<int64_t> moved_to(rows.size(), -1);  // where an old row went first
  for (size_t i = 0; i < from.size(); ++i) {
    const int64_t a = from[i];
    TRELLIS_CHECK(a >= 0 && a < size(), "cache row {} of {}", a, size());
    if (moved_to[size_t(a)] < 0) {
      next[i] = std::move(rows[size_t(a)]);
      moved_to[size_t(a)] = int64_t(i);
      continue;
    }
    const Row& src = next[size_t(moved_to[size_t(a)])];
    next[i].length = src.length;
    next[i].source = src.source;
    next[i].kv.reserve(size_t(capacity * stride));  // appending never reallocates
    next[i].kv.assign(src.kv.begin(), src.kv.end());
  }
  rows = std::move(next);
}

void KVCache::clear() {
  for (Row& r : rows) {
    r.length = 0;
    r.kv.clear();
  }
}

KVCache ModelChunk::start_cache(int64_t rows, int64_t capacity) const {
  TRELLIS_CHECK(tp_.size() == 1 && chunk_.embedding && chunk_.head && cfg_.lm_head(),
                "decoding runs the whole language model on a single rank");
  TRELLIS_REQUIRE(cfg_.subword_ngrams == 0,
                  "decoding does not add subword n-grams (config key 'subword_ngrams')");
  TRELLIS_REQUIRE(capacity >= 1 && capacity <= cfg_.block_size,
                  "a cache of {} positions does not fit the context length {}", capacity,
                  cfg_.block_size);
  int64_t decoder_blocks = 0;
  for (const Block& b : blocks_) decoder_blocks += !cfg_.encoder_decoder() || b.decoder;
  KVCache c;
  c.capacity = capacity;
  c.stride = decoder_blocks * 2 * Hkvl_ * hd_;
  c.rows.resize(size_t(rows));
  // Reserved, not touched: pages are committed as positions are written.
  for (KVCache::Row& r : c.rows) r.kv.reserve(size_t(capacity * c.stride));
  return c;
}

KVCache ModelChunk::encode(const std::vector<std::span<const uint32_t>>& sources, int64_t capacity,
                            int32_t end_token) {
  TRELLIS_CHECK(cfg_.encoder_decoder() && decoder_start_, "encode needs an encoder-decoder");
  KVCache c = start_cache(int64_t(sources.size()), capacity);
  const int64_t B = int64_t(sources.size()), KV = Hkvl_ * hd_;
  if (B == 0) return c;
  int64_t S = 1;
  for (const auto& s : sources) S = std::max<int64_t>(S, int64_t(s.size()) + 1);
  TRELLIS_REQUIRE(S <= cfg_.block_size,
                  "a source of {} tokens (with its end token) does not fit "
                  "{} positions",
                  S, cfg_.block_size);
  // The encoder as the full forward runs it: sources padded to S, padding keys masked.
  Context ctx;
  prepare(ctx, B, S);
  ctx.src_tokens.assign(size_t(B * S), end_token);
  ctx.tokens.assign(size_t(B * S), end_token);
  ctx.lengths.resize(size_t(B));
  for (int64_t b = 0; b < B; ++b) {
    const auto& s = sources[size_t(b)];
    std::copy(s.begin(), s.end(), ctx.src_tokens.begin() + b * S);
    ctx.lengths[size_t(b)] = int32_t(s.size() + 1);
  }
  ctx.dropping = false;
  set_doc_positions(ctx);
  start_pass();
  embed(ctx.src_tokens.data(), false, ctx.embedded.f32(), ctx);
  size_t i = 0;
  for (; i < blocks_.size() && !blocks_[i].decoder; ++i)
    block_forward(ctx, int(i), block_input(ctx, int(i)));
  const float* x = i > 0 ? ctx.blocks[i - 1].res_out.f32() : ctx.embedded.f32();
  enc_norm_.forward(ctx.enc.f32(), ctx.enc_mean.f32(), ctx.enc_rstd.f32(), x, B * S);
  // Each decoder block's cross keys and values of the real source positions, once.
  std::vector<std::shared_ptr<KVCache::Source>> src(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    src[size_t(b)] = std::make_shared<KVCache::Source>();
    src[size_t(b)]->length = ctx.lengths[size_t(b)];
    src[size_t(b)]->kv.resize(size_t(ctx.lengths[size_t(b)] * c.stride));
  }
  std::vector<float> kv(size_t(B * S * 2 * KV));
  for (int64_t li = 0; i < blocks_.size(); ++i, ++li) {
    blocks_[i].xkv.forward(kv.data(), ctx.enc.f32(), B * S);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t s = 0; s < src[size_t(b)]->length; ++s)
        std::copy_n(kv.data() + (b * S + s) * 2 * KV, 2 * KV,
                    src[size_t(b)]->kv.data() + s * c.stride + li * 2 * KV);
  }
  for (int64_t b = 0; b < B; ++b) c.rows[size_t(b)].source = std::move(src[size_t(b)]);
  return c;
}

const std::vector<float>& ModelChunk::decode(KVCache& c,
                                              const std::vector<std::span<const int32_t>>& tokens) {
  TRELLIS_CHECK(int64_t(tokens.size()) == c.size(), "{} token lists for {} cache rows",
                tokens.size(), c.size());
  const int64_t rows = c.size(), C = C_, V = cfg_.vocab_size;
  start_pass();
  KVCache::Work& w = c.work;
  w.qrow.assign(size_t(rows + 1), 0);
  w.past.resize(size_t(rows));
  w.tokens.clear();
  w.positions.clear();
  for (int64_t r = 0; r < rows; ++r) {
    KVCache::Row& row = c.rows[size_t(r)];
    const int64_t n = int64_t(tokens[size_t(r)].size());
    TRELLIS_REQUIRE(n >= 1 && row.length + n <= c.capacity,
                    "decoding {} more positions into a cache row of {} of {}", n, row.length,
                    c.capacity);
    TRELLIS_CHECK(!cfg_.encoder_decoder() || row.source, "cache row {} has no source", r);
    w.qrow[size_t(r + 1)] = w.qrow[size_t(r)] + n;
    w.past[size_t(r)] = row.length;
    for (int64_t j = 0; j < n; ++j) {
      const int32_t t = tokens[size_t(r)][size_t(j)];
      TRELLIS_REQUIRE(t >= 0 && t < cfg_.vocab_size,
                      "token id {} is outside the vocabulary (size {})", t, cfg_.vocab_size);
      w.tokens.push_back(t);
      w.positions.push_back(int32_t(row.length + j));
    }
    row.kv.resize(size_t((row.length + n) * c.stride));
  }
  const int64_t N = w.qrow.back();
  const int64_t Q = Hl_ * hd_, W = (Hl_ + 2 * Hkvl_) * hd_;
  const int64_t up = (cfg_.mlp == MlpKind::SwiGLU ? 2 : 1) * Fl_;
  for (auto* v : {&w.x, &w.y, &w.ln, &w.mid, &w.cross}) v->resize(size_t(N * C));
  w.mean.resize(size_t(N)), w.rstd.resize(size_t(N)), w.qkv.resize(size_t(N * W));
  w.att.resize(size_t(N * Q)), w.xq.resize(size_t(N * Q));
  w.up.resize(size_t(N * up)), w.act.resize(size_t(N * Fl_));
  w.k.resize(size_t(rows)), w.v.resize(size_t(rows)), w.src_len.resize(size_t(rows));

  // The decoder's embedding: tokens plus learned positions (an encoder-decoder's own table).
  lookup_tokens(w.x.data(), w.tokens.data(), N);
  add_positions(w.x.data(), cfg_.encoder_decoder(), 0, N, cfg_.block_size, w.positions.data());
  int64_t li = 0;
  for (const Block& p : blocks_) {
    if (cfg_.encoder_decoder() && !p.decoder) continue;
    block_decode(c, p, li++);
    std::swap(w.x, w.y);
  }
  // The head over each row's last new position.
  w.last.resize(size_t(rows * C));
  for (int64_t r = 0; r < rows; ++r) {
    std::copy_n(w.x.data() + (w.qrow[size_t(r + 1)] - 1) * C, C, w.last.data() + r * C);
    c.rows[size_t(r)].length += int32_t(w.qrow[size_t(r + 1)] - w.qrow[size_t(r)]);
  }
  lnf_.forward(w.ln.data(), w.mean.data(), w.rstd.data(), w.last.data(), rows);
  w.logits.resize(size_t(rows * V));
  k_.gemm_operands(false, true, rows, V, C, 1.0f, {w.ln.data(), nullptr, C}, head_weight(), 0.0f,
                   w.logits.data(), V);
  as_head_output(w.logits);
  return w.logits;
}

void ModelChunk::block_decode(KVCache& c, const Block& p, int64_t li) const {
  KVCache::Work& w = c.work;
  const int64_t rows = c.size(), N = w.qrow.back(), C = C_;
  const int64_t Q = Hl_ * hd_, KV = Hkvl_ * hd_, W = p.qkv.out();
  const float* x = w.x.data();
  p.ln1.forward(w.ln.data(), w.mean.data(), w.rstd.data(), x, N);
  float* qkv = w.qkv.data();
  p.qkv.forward(qkv, w.ln.data(), N);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t q0 = w.qrow[size_t(r)], n = w.qrow[size_t(r + 1)] - q0, past = w.past[size_t(r)];
    // Positions past .. past + n - 1: row0 = past of a table as long as the context.
    if (cfg_.positions == PositionKind::Rope)
      k_.rope_forward(qkv + q0 * W, W, n, past, cfg_.block_size, Hl_ + Hkvl_, hd_, cfg_.rope_theta,
                      nullptr);
    float* kv = c.rows[size_t(r)].kv.data() + li * 2 * KV;
    for (int64_t j = 0; j < n; ++j) {
      std::copy_n(qkv + (q0 + j) * W + Q, 2 * KV, kv + (past + j) * c.stride);  // k | v
    }
    w.k[size_t(r)] = kv;
    w.v[size_t(r)] = kv + KV;
  }
  k_.attention_cached(w.att.data(), qkv, W, w.k.data(), w.v.data(),
                      {rows, Hl_, Hkvl_, hd_, c.stride, w.qrow.data(), w.past.data(), true});
  p.proj.forward(w.mid.data(), w.att.data(), N, false);
  k_.add_bias(w.mid.data(), p.proj.bias(), x, N, C);
  const float* mid = w.mid.data();
  if (p.decoder) {  // queries from the decoder, keys and values of the source, computed once
    p.lnx.forward(w.ln.data(), w.mean.data(), w.rstd.data(), mid, N);
    p.xq.forward(w.xq.data(), w.ln.data(), N);
    for (int64_t r = 0; r < rows; ++r) {
      const KVCache::Source& s = *c.rows[size_t(r)].source;
      w.k[size_t(r)] = s.kv.data() + li * 2 * KV;
      w.v[size_t(r)] = w.k[size_t(r)] + KV;
      w.src_len[size_t(r)] = s.length;
    }
    k_.attention_cached(w.att.data(), w.xq.data(), Q, w.k.data(), w.v.data(),
                        {rows, Hl_, Hkvl_, hd_, c.stride, w.qrow.data(), w.src_len.data(), false});
    p.xproj.forward(w.cross.data(), w.att.data(), N, false);
    k_.add_bias(w.cross.data(), p.xproj.bias(), mid, N, C);
    mid = w.cross.data();
  }
  float* out = w.y.data();
  if (p.up.empty()) {
    std::copy_n(mid, N * C, out);
    return;
  }
  p.ln2.forward(w.ln.data(), w.mean.data(), w.rstd.data(), mid, N);
  mlp_activation(p, w.up.data(), w.act.data(), w.ln.data(), N);
  p.down.forward(out, w.act.data(), N, false);
  k_.add_bias(out, p.down.bias(), mid, N, C);
}

}  // namespace trellis
