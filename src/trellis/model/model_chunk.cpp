#include "trellis/model/model_chunk.h"

#include <algorithm>
#include <bit>

#include "trellis/core/bf16.h"
#include "trellis/core/error.h"
#include "trellis/core/philox.h"
#include "trellis/model/activation_memory.h"

namespace trellis {

namespace {
// Dropout sites: the `site` of dropout_key (docs/training.md, "Dropout"). The embeddings' and the
// classifier's masks use layer 0; a block's use its global layer index.
enum DropSite : int {
  kEmbedDrop = 0,       // the embedding output (an encoder-decoder's encoder side)
  kDecEmbedDrop = 1,    // an encoder-decoder's decoder embedding output
  kAttnProbsDrop = 2,   // self-attention probabilities
  kAttnOutDrop = 3,     // the self-attention branch (after the output projection and its bias)
  kCrossProbsDrop = 4,  // cross-attention probabilities
  kCrossOutDrop = 5,    // the cross-attention branch
  kMlpOutDrop = 6,      // the MLP branch (after the down projection and its bias)
  kClassifierDrop = 7,  // a classifier's pooled vector
};

// Scratch grows to the largest micro-batch seen and is reused.
void grow(Tensor& t, int64_t n) {
  if (t.numel() < n) t = Tensor::zeros({n});
}

// A kept tensor as a linear layer's input rows, in the precision it is kept in.
Rows rows_of(const Tensor& t) {
  return t.dtype() == DType::BF16 ? Rows(t.bf16()) : Rows(t.f32());
}
}  // namespace

Recompute parse_recompute(const std::string& name) {
  if (name == "none") return Recompute::None;
  if (name == "selective") return Recompute::Selective;
  if (name == "full") return Recompute::Full;
  TRELLIS_REQUIRE(false, "unknown recompute '{}' (choose none, selective or full)", name);
  return Recompute::None;
}

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::None:
      return "none";
    case Recompute::Selective:
      return "selective";
    case Recompute::Full:
      return "full";
  }
  return "none";
}

namespace {
int64_t owned_bytes(const Tensor& t) { return t.owned() ? int64_t(t.bytes()) : 0; }

int64_t block_bytes(const Context::BlockActs& a) {
  int64_t n = 0;
  for (const Tensor* t :
       {&a.ln1,      &a.ln1_mean, &a.ln1_rstd, &a.ln1_full, &a.qkv,      &a.lse,    &a.att,
        &a.res_mid,  &a.lnx,      &a.lnx_mean, &a.lnx_rstd, &a.lnx_full, &a.xq,       &a.enc_full,
        &a.xkv,      &a.xlse,     &a.xatt,     &a.res_x,    &a.ln2,      &a.ln2_mean, &a.ln2_rstd,
        &a.ln2_full, &a.up,       &a.act,      &a.res_out,  &a.dproj,    &a.ddown,    &a.dxproj,
        &a.dup,      &a.dqkv})
    n += owned_bytes(*t);
  return n;
}
}  // namespace

int64_t Context::activation_bytes() const {
  int64_t n = 0;
  for (const BlockActs& a : blocks) n += block_bytes(a);
  for (const Tensor* t :
       {&embedded, &enc, &enc_mean, &enc_rstd, &dec_embedded, &lnf, &lnf_mean, &lnf_rstd, &lnf_full,
        &logits_or_grad, &losses, &pooled, &class_logits_or_grad, &input, &dinput, &doutput, &carry})
    n += owned_bytes(*t);
  return n;
}

int64_t ModelChunk::workspace_bytes() const {
  int64_t n = block_bytes(work_);
  for (const Tensor* t : {&full_, &dres_, &dln_, &dfull_, &dqkv_, &datt_, &dup_, &dact_, &denc_,
                          &denc_full_, &dxq_, &dxkv_})
    n += owned_bytes(*t);
  return n;
}

ModelChunk::ModelChunk(const ParamLayout& layout, float* params, float* grads, TensorParallel& tp,
                         const StageSpec* chunk, DType compute)
    : k_(backend(Device::CPU, compute)),
      bf16_(compute == DType::BF16),
      cfg_(layout.config()),
      chunk_(chunk ? *chunk : layout.stage()),
      tp_(tp) {
  cfg_.validate();
  TRELLIS_CHECK(layout.tp() == tp.size() && layout.tp_rank() == tp.rank(),
                "parameter layout is for tp rank {}/{}, the group is {}/{}", layout.tp_rank(),
                layout.tp(), tp.rank(), tp.size());
  TRELLIS_CHECK(!chunk_.layers.empty(), "a model chunk needs at least one block");
  C_ = cfg_.n_embd;
  hd_ = cfg_.head_size();
  Hl_ = cfg_.n_head / tp.size();
  Hkvl_ = cfg_.kv_heads() / tp.size();
  Fl_ = cfg_.ffn() / tp.size();
  vocab_rows_ = layout.vocab_local();
  vocab_start_ = layout.vocab_start();
  vocab_valid_ = std::clamp<int64_t>(cfg_.vocab_size - vocab_start_, 0, vocab_rows_);
  const ChunkRole role = chunk_role(cfg_, chunk_);
  decoder_start_ = role.decoder_start;
  has_decoder_ = role.has_decoder;
  carry_in_ = role.carry_in;
  carry_out_ = role.carry_out;
  WeightCopies* copies = bf16_ ? &copies_ : nullptr;
  auto bind = [&](const ParamSpec* s, const float*& p, float*& g) {
    TRELLIS_CHECK(s, "the parameter layout lacks a tensor this chunk needs");
    p = params + s->offset;
    g = grads ? grads + s->offset : nullptr;
  };
  TRELLIS_REQUIRE(cfg_.lm_head() || !tp.sequence_parallel(),
                  "sequence parallelism is not supported for classifiers (their pooling spans the "
                  "sequence); use tensor parallelism without it");
  const bool feature_input = chunk_.embedding && cfg_.input_features > 0;
  if (feature_input) features_ = Linear(k_, layout, {Slot::FeatureEmbed}, -1, params, grads, copies);
  if ((chunk_.embedding && !feature_input) || (chunk_.head && cfg_.tied_lm_head()) ||
      decoder_start_)
    bind(layout.find(Slot::TokEmbed, -1), emb_, demb_);
  if (chunk_.embedding && cfg_.positions == PositionKind::Learned)
    bind(layout.find(Slot::PosEmbed, -1), pos_, dpos_);
  if (chunk_.embedding && cfg_.subword_ngrams > 0) {
    // Replicated, added after the vocabulary-parallel lookup: it would need adding on one
    // tensor-parallel rank only, which no layout test covers yet.
    TRELLIS_REQUIRE(tp.size() == 1,
                    "config key 'subword_ngrams': subword n-grams do not support tensor "
                    "parallelism yet (tp = {}); use tp = 1",
                    tp.size());
    bind(layout.find(Slot::NgramEmbed, -1), ngram_w_, dngram_w_);
  }
  if (decoder_start_) {
    enc_norm_ = Norm(k_, cfg_, layout, Slot::EncoderNorm, cfg_.n_layer, params, grads);
    bind(layout.find(Slot::DecPosEmbed, cfg_.n_layer), dec_pos_, ddec_pos_);
  }
  if (chunk_.head) {
    lnf_ = Norm(k_, cfg_, layout, Slot::FinalNorm, -1, params, grads);
    if (!cfg_.lm_head()) {
      classifier_ = Linear(k_, layout, {Slot::Classifier}, -1, params, grads, copies);
    } else if (cfg_.tied_head) {
      head_w_ = emb_, dhead_w_ = demb_;
    } else {
      bind(layout.find(Slot::Head, -1), head_w_, dhead_w_);
    }
  }
  for (int l : chunk_.layers) {
    Block b;
    b.layer = l;
    b.decoder = cfg_.encoder_decoder() && l >= cfg_.n_layer;
    b.ln1 = Norm(k_, cfg_, layout, Slot::AttnNorm, l, params, grads);
    b.qkv = Linear(k_, layout, {Slot::Qkv, Slot::Q, Slot::K, Slot::V}, l, params, grads, copies);
    b.proj = Linear(k_, layout, {Slot::AttnOut}, l, params, grads, copies);
    if (b.decoder) {
      b.lnx = Norm(k_, cfg_, layout, Slot::CrossNorm, l, params, grads);
      b.xq = Linear(k_, layout, {Slot::CrossQ}, l, params, grads, copies);
      b.xkv = Linear(k_, layout, {Slot::CrossK, Slot::CrossV}, l, params, grads, copies);
      b.xproj = Linear(k_, layout, {Slot::CrossOut}, l, params, grads, copies);
    }
    if (cfg_.mlp != MlpKind::None) {
      b.ln2 = Norm(k_, cfg_, layout, Slot::MlpNorm, l, params, grads);
      b.up = Linear(k_, layout, {Slot::MlpUp, Slot::Gate, Slot::Up}, l, params, grads, copies);
      b.down = Linear(k_, layout, {Slot::MlpDown}, l, params, grads, copies);
    }
    const int64_t up_width = (cfg_.mlp == MlpKind::SwiGLU ? 2 : 1) * Fl_;
    const bool mlp = cfg_.mlp != MlpKind::None;
    TRELLIS_CHECK(b.qkv.out() == (Hl_ + 2 * Hkvl_) * hd_ && b.proj.in() == Hl_ * hd_ &&
                      (!mlp || (b.up.out() == up_width && b.down.in() == Fl_)) &&
                      (!b.decoder || (b.xq.out() == Hl_ * hd_ && b.xkv.out() == 2 * Hkvl_ * hd_)),
                  "block {}: the family's tensors do not match the configured widths", l);
    blocks_.push_back(std::move(b));
  }
  if (bf16_ && cfg_.bf16_embeddings) {
    auto table = [&](Slot slot, int layer, const float* w) {
      return w ? copies_.add(w, int64_t(layout.find(slot, layer)->numel())) : -1;
    };
    if ((chunk_.embedding && !feature_input) || decoder_start_)
      emb_copy_ = table(Slot::TokEmbed, -1, emb_);
    pos_copy_ = table(Slot::PosEmbed, -1, pos_);
    dec_pos_copy_ = table(Slot::DecPosEmbed, cfg_.n_layer, dec_pos_);
    ngram_copy_ = table(Slot::NgramEmbed, -1, ngram_w_);
  }
  // A tied head multiplies the copy its lookup reads, where both run here.
  if (bf16_ && chunk_.head && cfg_.lm_head())
    head_copy_ =
        cfg_.tied_head && emb_copy_ >= 0 ? emb_copy_ : copies_.add(head_w_, vocab_rows_ * C_);
}

// Self-attention is causal in decoders: an encoder-decoder's encoder blocks see the whole source.
// Padding keys are masked (ctx.lengths counts the source's: a decoder's own padding comes after
// its real tokens, which the causal mask already hides from them). Padding query rows are skipped:
// their outputs only ever reach masked keys, pooling that skips them and targets that are not
// counted, so their gradient is 0 under either kernel.
ops::AttentionShape ModelChunk::attention_shape(const Context& ctx, const Block& b) const {
  const int32_t* key_len = ctx.lengths.empty() || b.decoder ? nullptr : ctx.lengths.data();
  // Packed documents (decoder-only models; forward checks): a block-diagonal causal mask.
  const int32_t* seg_start = ctx.doc_start.empty() ? nullptr : ctx.doc_start.data();
  ops::Dropout drop = dropout_of(ctx, cfg_.attn_dropout, b.layer, kAttnProbsDrop);
  drop.head0 = tp_.rank() * Hl_;  // the global index of this rank's first head
  ops::AttentionShape shape{ctx.B,
                            ctx.T,
                            ctx.T,
                            Hl_,
                            Hkvl_,
                            hd_,
                            cfg_.causal && (!cfg_.encoder_decoder() || b.decoder),
                            key_len,
                            seg_start,
                            drop};
  shape.query_len = key_len;
  return shape;
}

ops::Dropout ModelChunk::dropout_of(const Context& ctx, float p, int layer, int site) const {
  if (!ctx.dropping || !(p > 0.0f)) return {};
  return {
      p, dropout_key(ctx.dropout.seed, uint64_t(ctx.dropout.step), uint64_t(layer), uint64_t(site)),
      ctx.dropout.first, 0};
}

// Rows are this rank's: under sequence parallelism an offset slice of the B*T rows.
void ModelChunk::drop_rows(const Context& ctx, float* out, const float* in, const float* residual,
                            const ops::Dropout& d) const {
  const int64_t BT = ctx.B * ctx.T;
  k_.dropout(out, in, residual, tp_.local_rows(BT), tp_.first_row(BT), ctx.T, C_, d);
}

// out (the branch, its rows summed over the group) += bias, then out = x + drop(out); without
// dropout the one fused pass of before (x + bias added first, as always).
void ModelChunk::add_branch(const Context& ctx, float* out, const float* bias, const float* x,
                             int layer, int site) const {
  const int64_t R = tp_.local_rows(ctx.B * ctx.T);
  const ops::Dropout d = dropout_of(ctx, cfg_.dropout, layer, site);
  if (d.p <= 0.0f) return k_.add_bias(out, bias, x, R, C_);
  k_.add_bias(out, bias, nullptr, R, C_);
  drop_rows(ctx, out, out, x, d);
}

// d(branch) from d(out) (dres, which stays d(x) for the residual path): dres itself without
// dropout, else dres o M / (1 - p) in `scratch` (R rows).
float* ModelChunk::branch_grad(const Context& ctx, float* dres, float* scratch, int layer,
                                int site) const {
  const ops::Dropout d = dropout_of(ctx, cfg_.dropout, layer, site);
  if (d.p <= 0.0f) return dres;
  drop_rows(ctx, scratch, dres, nullptr, d);
  return scratch;
}

// Positions restart at each packed document (null: position t of each row).
static const int32_t* doc_positions(const Context& ctx) {
  return ctx.positions.empty() ? nullptr : ctx.positions.data();
}

void ModelChunk::prepare(Context& ctx, int64_t B, int64_t T) {
  TRELLIS_REQUIRE(!tp_.sequence_parallel() || B * T % tp_.size() == 0,
                  "sequence parallelism needs batch x sequence rows ({}) divisible by tp={}", B * T,
                  tp_.size());
  prepare(ctx, activation_layout(cfg_, chunk_, B, T, tp_.size(), tp_.sequence_parallel(),
                                 bf16_ ? DType::BF16 : DType::F32));
}

void ModelChunk::prepare(Context& ctx, const ActivationLayout& layout) {
  const ActivationDims& d = layout.dims;
  TRELLIS_CHECK(layout.blocks.size() == blocks_.size() && d.R == tp_.local_rows(d.BT) &&
                    d.vocab_rows == vocab_rows_,
                "an activation layout for another chunk or tensor-parallel slice");
  // The weight part reads the kept inputs of every linear layer, which recompute drops.
  TRELLIS_REQUIRE(!ctx.split_backward || ctx.recompute == Recompute::None,
                  "a split backward (schedule zb1) needs recompute none, not {}",
                  recompute_name(ctx.recompute));
  ctx.B = d.B;
  ctx.T = d.T;
  ctx.tokens.resize(size_t(d.BT));
  ctx.targets.resize(size_t(d.BT));
  // A Context keeps the groups its policy says; the workspace (grown, never shrunk: it serves
  // every Context of this model) holds the others, for one block.
  auto kept = [](const std::vector<int64_t>& shape, bool keep) {
    std::vector<int64_t> s = shape;
    if (!keep) s[0] = 0;
    return s;
  };
  ctx.blocks.resize(blocks_.size());
  for (size_t i = 0; i < ctx.blocks.size(); ++i)
    for (const BlockTensor& t : layout.blocks[i])
      fit(ctx.blocks[i].*t.member,
          kept(t.shape, context_keeps(ctx.recompute, t.group, ctx.split_backward)), t.dtype);
  for (const BlockTensor& t : layout.workspace_block) {
    Tensor& w = work_.*t.member;
    int64_t n = rebuilt_in_workspace(ctx.recompute, t.group);
    for (int64_t dim : t.shape) n *= dim;
    if (!w.owned() || w.dtype() != t.dtype || w.numel() < n) w = Tensor::zeros({n}, t.dtype);
  }
  for (const ContextTensor& t : layout.context) fit(ctx.*t.member, t.shape, t.dtype);
  const int64_t classified = chunk_.head && !cfg_.lm_head() ? d.B : 0;
  ctx.predictions.assign(size_t(classified), -1);
  if (cfg_.input_features > 0)
    ctx.features.resize(size_t(chunk_.embedding ? d.BT * cfg_.input_features : 0));
  const GradScratch& s = layout.scratch;
  grow(full_, s.full), grow(dres_, s.dres), grow(dln_, s.dln), grow(dfull_, s.dfull);
  grow(dqkv_, s.dqkv), grow(datt_, s.datt), grow(dup_, s.dup), grow(dact_, s.dact);
  grow(denc_, s.denc), grow(denc_full_, s.denc_full), grow(dxq_, s.dxq), grow(dxkv_, s.dxkv);
}

Tensor& ModelChunk::output(Context& ctx) const {
  Tensor& hidden = ctx.blocks.back().res_out;
  if (!carry_out_) return hidden;
  const int64_t n = hidden.numel();
  std::copy_n(hidden.f32(), n, ctx.carry.f32());
  std::copy_n(encoder_output(ctx), n, ctx.carry.f32() + n);
  return ctx.carry;
}

const float* ModelChunk::encoder_output(Context& ctx) const {
  if (carry_in_) return ctx.input.f32() + ctx.input.numel() / 2;
  return ctx.enc.f32();
}

void ModelChunk::lookup_tokens(float* out, const int32_t* tokens, int64_t n) {
  if (emb_copy_ >= 0)
    k_.embedding_forward_bf16(out, tokens, copies_.bits(k_, emb_copy_), vocab_start_, vocab_rows_,
                              n, C_);
  else
    k_.embedding_forward(out, tokens, emb_, vocab_start_, vocab_rows_, n, C_);
}

void ModelChunk::add_positions(float* out, bool decoder, int64_t row0, int64_t rows, int64_t T,
                               const int32_t* positions) {
  const float* table = decoder ? dec_pos_ : pos_;
  const int copy = decoder ? dec_pos_copy_ : pos_copy_;
  if (copy >= 0)
    k_.position_forward_bf16(out, copies_.bits(k_, copy), row0, rows, T, C_, positions);
  else if (table)
    k_.position_forward(out, table, row0, rows, T, C_, positions);
}

void ModelChunk::embed(const int32_t* tokens, bool decoder, float* out, const Context& ctx) {
  const int64_t BT = ctx.B * ctx.T;
  if (!features_.empty()) {  // replicated: each rank projects its own rows
    const int64_t F = cfg_.input_features;
    features_.forward(out, ctx.features.data() + tp_.first_row(BT) * F, tp_.local_rows(BT));
    add_positions(out, decoder, tp_.first_row(BT), tp_.local_rows(BT), ctx.T, doc_positions(ctx));
    return;
  }
  for (int64_t i = 0; i < BT; ++i)
    TRELLIS_REQUIRE(tokens[i] >= 0 && tokens[i] < cfg_.vocab_size,
                    "token id {} is outside the vocabulary (size {})", tokens[i], cfg_.vocab_size);
  // Each rank looks up the tokens of its vocabulary slice; leaving the region sums the slices.
  float* lookup = tp_.sequence_parallel() ? full_.f32() : out;
  lookup_tokens(lookup, tokens, BT);
  if (ngram_w_) ngrams_forward(tokens, lookup, ctx);
  tp_.leave(lookup, out, BT, C_);
  add_positions(out, decoder, tp_.first_row(BT), tp_.local_rows(BT), ctx.T, doc_positions(ctx));
}

// Backward of embed from d(out) in dres_.
void ModelChunk::embed_backward(const int32_t* tokens, float* dpos, const Context& ctx) {
  const int64_t BT = ctx.B * ctx.T, R = tp_.local_rows(BT), C = C_;
  if (dpos)
    k_.position_backward(dpos, dres_.f32(), tp_.first_row(BT), R, ctx.T, C, doc_positions(ctx));
  if (!features_.empty()) {
    features_.backward(nullptr, dres_.f32(),
                       ctx.features.data() + tp_.first_row(BT) * cfg_.input_features, R);
    return;
  }
  const float* dfull = tp_.leave_backward(dres_.f32(), dfull_.f32(), BT, C);
  k_.embedding_backward(demb_, dfull, tokens, vocab_start_, vocab_rows_, BT, C);
  if (ngram_w_) ngrams_backward(tokens, dfull, ctx);
}

namespace {
// The n-gram bags of the B rows of T tokens (each row its own sequence): ids and offsets
// [B*T + 1].
void row_bags(const SubwordNgrams* ngrams, const int32_t* tokens, int64_t B, int64_t T,
              std::vector<int32_t>& ids, std::vector<int64_t>& offsets) {
  TRELLIS_CHECK(ngrams, "a model with subword_ngrams > 0 runs without its n-gram table");
  ids.clear();
  offsets.clear();
  for (int64_t b = 0; b < B; ++b) {
    if (b > 0) offsets.pop_back();  // row b's first offset is row b - 1's end
    ngrams->bags(tokens + b * T, T, ids, offsets);
  }
}
}  // namespace

void ModelChunk::ngrams_forward(const int32_t* tokens, float* out, const Context& ctx) {
  std::vector<int32_t> ids;
  std::vector<int64_t> offsets;
  row_bags(subword_, tokens, ctx.B, ctx.T, ids, offsets);
  const int64_t C = C_;
  const uint16_t* w16 = ngram_copy_ >= 0 ? copies_.bits(k_, ngram_copy_) : nullptr;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < ctx.B * ctx.T; ++r) {
    const int64_t begin = offsets[size_t(r)], end = offsets[size_t(r + 1)];
    if (begin == end) continue;
    const float inv = 1.0f / float(end - begin);
    float* y = out + r * C;
    for (int64_t i = begin; i < end; ++i) {
      const int64_t row = int64_t(ids[size_t(i)]) * C;
      if (w16)
        for (int64_t c = 0; c < C; ++c) y[c] += inv * widen_bf16(w16[row + c]);
      else
        for (int64_t c = 0; c < C; ++c) y[c] += inv * ngram_w_[row + c];
    }
  }
}

void ModelChunk::ngrams_backward(const int32_t* tokens, const float* dout,
                                 const Context& ctx) const {
  std::vector<int32_t> ids;
  std::vector<int64_t> offsets;
  row_bags(subword_, tokens, ctx.B, ctx.T, ids, offsets);
  const int64_t C = C_;
  // Serial: bags of different rows share buckets (the same word, colliding hashes).
  for (int64_t r = 0; r < ctx.B * ctx.T; ++r) {
    const int64_t begin = offsets[size_t(r)], end = offsets[size_t(r + 1)];
    if (begin == end) continue;
    const float inv = 1.0f / float(end - begin);
    const float* dy = dout + r * C;
    for (int64_t i = begin; i < end; ++i) {
      float* dw = dngram_w_ + int64_t(ids[size_t(i)]) * C;
      for (int64_t c = 0; c < C; ++c) dw[c] += inv * dy[c];
    }
  }
}

// The encoder ends (its final norm makes the encoder output) and the decoder starts (its
// embedding of the target tokens).
void ModelChunk::decoder_start_forward(Context& ctx, const float* x_enc) {
  const int64_t R = tp_.local_rows(ctx.B * ctx.T);
  enc_norm_.forward(ctx.enc.f32(), ctx.enc_mean.f32(), ctx.enc_rstd.f32(), x_enc, R);
  embed(ctx.tokens.data(), true, ctx.dec_embedded.f32(), ctx);
  if (const ops::Dropout d = dropout_of(ctx, cfg_.dropout, 0, kDecEmbedDrop); d.p > 0.0f)
    drop_rows(ctx, ctx.dec_embedded.f32(), ctx.dec_embedded.f32(), nullptr, d);
}

Context::BlockActs& ModelChunk::acts(Context& ctx, int l, Context::BlockActs& view) {
  Context::BlockActs& kept = ctx.blocks[size_t(l)];
  switch (ctx.recompute) {
    case Recompute::None:
      return kept;
    case Recompute::Selective:
      view = kept;
      view.up = work_.up;
      view.act = work_.act;
      return view;
    case Recompute::Full:
      view = work_;
      view.res_out = kept.res_out;
      return view;
  }
  return kept;
}

void ModelChunk::self_attention(const Context& ctx, const Block& p, Context::BlockActs& a) {
  const int64_t W = p.qkv.out(), Q = Hl_ * hd_, KV = Hkvl_ * hd_;
  if (a.qkv.dtype() == DType::BF16) {
    const uint16_t* qkv = a.qkv.bf16();
    return k_.attention_forward_bf16(a.att.f32(), a.lse.f32(), qkv, W, qkv + Q, qkv + Q + KV, W,
                                     attention_shape(ctx, p));
  }
  const float* qkv = a.qkv.f32();
  k_.attention_forward(a.att.f32(), a.lse.f32(), qkv, W, qkv + Q, qkv + Q + KV, W,
                       attention_shape(ctx, p));
}

ops::AttentionShape ModelChunk::cross_attention_shape(const Context& ctx, const Block& p) const {
  ops::AttentionShape shape = attention_shape(ctx, p);
  shape.causal = false;  // every target position sees the whole (real) source
  shape.key_len = ctx.lengths.empty() ? nullptr : ctx.lengths.data();
  shape.query_len = nullptr;  // the target's rows: ctx.lengths counts the source's
  shape.dropout = dropout_of(ctx, cfg_.attn_dropout, p.layer, kCrossProbsDrop);
  shape.dropout.head0 = tp_.rank() * Hl_;
  return shape;
}

void ModelChunk::cross_attention(const Context& ctx, const Block& p, Context::BlockActs& a) {
  const int64_t KV = Hkvl_ * hd_;
  k_.attention_forward(a.xatt.f32(), a.xlse.f32(), a.xq.f32(), Hl_ * hd_, a.xkv.f32(),
                       a.xkv.f32() + KV, 2 * KV, cross_attention_shape(ctx, p));
}

float* ModelChunk::staged(Tensor& kept, Tensor& staging) {
  return kept.dtype() == DType::BF16 ? staging.f32() : kept.f32();
}

void ModelChunk::keep(Tensor& kept, const float* staged, int64_t n) const {
  if (kept.dtype() == DType::BF16) k_.to_bf16(kept.bf16(), staged, n);
}

Rows ModelChunk::enter(Tensor& local, Tensor& full, int64_t rows) {
  if (local.dtype() == DType::BF16) return local.bf16();  // kept in bf16 only without SP
  return tp_.enter(local.f32(), full.f32(), rows, C_);
}

Rows ModelChunk::saved_input(const Tensor& local, const Tensor& full) const {
  return tp_.sequence_parallel() ? Rows(full.f32()) : rows_of(local);
}

void ModelChunk::mlp_forward(const Block& p, Context::BlockActs& a, Rows in, int64_t rows) {
  if (a.up.dtype() != DType::BF16) {
    float* act = staged(a.act, dact_);  // (dact_ is free in forward and before mlp_backward uses it)
    mlp_activation(p, a.up.f32(), act, in, rows);
    keep(a.act, act, rows * Fl_);
    return;
  }
  TRELLIS_CHECK(a.act.dtype() == DType::BF16, "an MLP keeping its up projection in bf16 but not its activation");
  // The GEMM's fp32 output goes to dup_ (free in forward, and in backward until mlp_backward
  // zeroes it), the kernel rounds it into a.up and writes the activation in bf16.
  const float* bias = cfg_.mlp == MlpKind::Gelu ? p.up.bias() : nullptr;  // added by the GELU pass
  float* pre = dup_.f32();
  p.up.forward(pre, in, rows, !bias);
  if (cfg_.mlp == MlpKind::SwiGLU)
    k_.swiglu_forward_bf16(a.act.bf16(), a.up.bf16(), pre, rows, Fl_);
  else
    k_.gelu_forward_bf16(a.act.bf16(), a.up.bf16(), pre, bias, rows, Fl_);
}

Tensor& ModelChunk::kept_grad(Tensor& output, Tensor& own) {
  return output.dtype() == DType::BF16 ? own : output;
}

void ModelChunk::mlp_activation(const Block& p, float* up, float* act, Rows in,
                                int64_t rows) const {
  const bool fused_bias = cfg_.mlp == MlpKind::Gelu && p.up.bias();  // added by the GELU pass
  p.up.forward(up, in, rows, !fused_bias);
  if (cfg_.mlp == MlpKind::SwiGLU)
    k_.swiglu_forward(act, up, rows, Fl_);
  else if (fused_bias)
    k_.gelu_bias_forward(act, up, p.up.bias(), rows, Fl_);
  else
    k_.gelu_forward(act, up, rows * Fl_);
}

const float* ModelChunk::block_input(Context& ctx, int i) const {
  if (decoder_start_ && blocks_[size_t(i)].layer == cfg_.n_layer) return ctx.dec_embedded.f32();
  if (i > 0) return ctx.blocks[size_t(i - 1)].res_out.f32();
  return chunk_.embedding ? ctx.embedded.f32() : ctx.input.f32();
}

void ModelChunk::block_forward(Context& ctx, int l, const float* x, bool recompute) {
  const int64_t BT = ctx.B * ctx.T, R = tp_.local_rows(BT), C = C_;
  const bool sp = tp_.sequence_parallel();
  const Block& p = blocks_[size_t(l)];
  Context::BlockActs view;
  Context::BlockActs& a = acts(ctx, l, view);
  // Attention: heads split across the group (q|k|v column-parallel, projection row-parallel).
  // (a bf16 norm output is written to dln_, free in forward, and kept rounded)
  float* ln1 = staged(a.ln1, dln_);
  p.ln1.forward(ln1, a.ln1_mean.f32(), a.ln1_rstd.f32(), x, R);
  keep(a.ln1, ln1, R * C);
  // (a bf16 q|k|v: the GEMM and RoPE write fp32 to dqkv_, free in forward and until
  // block_backward zeroes it, and the result is kept rounded once)
  float* qkv = staged(a.qkv, dqkv_);
  const int64_t W = p.qkv.out();
  p.qkv.forward(qkv, enter(a.ln1, a.ln1_full, BT), BT);
  if (cfg_.positions == PositionKind::Rope)  // q and k heads are the first Hl + Hkvl of a row
    k_.rope_forward(qkv, W, BT, 0, ctx.T, Hl_ + Hkvl_, hd_, cfg_.rope_theta, doc_positions(ctx));
  keep(a.qkv, qkv, BT * W);
  self_attention(ctx, p, a);
  float* partial = sp ? full_.f32() : a.res_mid.f32();
  p.proj.forward(partial, a.att.f32(), BT, false);
  tp_.leave(partial, a.res_mid.f32(), BT, C);
  add_branch(ctx, a.res_mid.f32(), p.proj.bias(), x, p.layer, kAttnOutDrop);
  if (p.decoder) cross_forward(ctx, l, a);
  // MLP: up (or gate|up) column-parallel, down row-parallel.
  const float* mid = p.decoder ? a.res_x.f32() : a.res_mid.f32();
  if (p.up.empty()) {  // attention-only block
    if (!recompute) std::copy_n(mid, R * C, a.res_out.f32());
    return;
  }
  float* ln2 = staged(a.ln2, dln_);
  p.ln2.forward(ln2, a.ln2_mean.f32(), a.ln2_rstd.f32(), mid, R);
  keep(a.ln2, ln2, R * C);
  mlp_forward(p, a, enter(a.ln2, a.ln2_full, BT), BT);
  if (recompute) return;  // backward needs nothing after the activation; the output is kept
  partial = sp ? full_.f32() : a.res_out.f32();
  p.down.forward(partial, rows_of(a.act), BT, false);
  tp_.leave(partial, a.res_out.f32(), BT, C);
  add_branch(ctx, a.res_out.f32(), p.down.bias(), mid, p.layer, kMlpOutDrop);
}

// Cross-attention: queries from the decoder (res_mid), keys and values from the encoder output.
void ModelChunk::cross_forward(Context& ctx, int l, Context::BlockActs& a) {
  const int64_t BT = ctx.B * ctx.T, R = tp_.local_rows(BT), C = C_;
  const bool sp = tp_.sequence_parallel();
  const Block& p = blocks_[size_t(l)];
  float* lnx = staged(a.lnx, dln_);
  p.lnx.forward(lnx, a.lnx_mean.f32(), a.lnx_rstd.f32(), a.res_mid.f32(), R);
  keep(a.lnx, lnx, R * C);
  p.xq.forward(a.xq.f32(), enter(a.lnx, a.lnx_full, BT), BT);
  const float* enc = tp_.enter(encoder_output(ctx), a.enc_full.f32(), BT, C);
  p.xkv.forward(a.xkv.f32(), enc, BT);
  cross_attention(ctx, p, a);
  float* partial = sp ? full_.f32() : a.res_x.f32();
  p.xproj.forward(partial, a.xatt.f32(), BT, false);
  tp_.leave(partial, a.res_x.f32(), BT, C);
  add_branch(ctx, a.res_x.f32(), p.xproj.bias(), a.res_mid.f32(), p.layer, kCrossOutDrop);
}

void ModelChunk::head_forward(Context& ctx, const float* x) {
  const int64_t BT = ctx.B * ctx.T, R = tp_.local_rows(BT);
  float* lnf = staged(ctx.lnf, dln_);
  lnf_.forward(lnf, ctx.lnf_mean.f32(), ctx.lnf_rstd.f32(), x, R);
  keep(ctx.lnf, lnf, R * C_);
  const Rows in = enter(ctx.lnf, ctx.lnf_full, BT);
  // logits over this rank's vocabulary slice (padding rows are zero and masked in the loss).
  if (ctx.logits_or_grad.dtype() == DType::F32) {
    k_.gemm_operands(false, true, BT, vocab_rows_, C_, 1.0f, in.operand(C_), head_weight(), 0.0f,
                     ctx.logits_or_grad.f32(), vocab_rows_);
    return;
  }
  // Kept in bf16 (autocast's linear output): the GEMM writes fp32 columns [j0, j0 + n) into
  // backward's free dqkv scratch, [BT, n] with n its width, which are rounded into the logits;
  // no [BT, vocabulary] fp32 buffer exists. Columns, not rows: each weight row is read once.
  const int64_t fit = dqkv_.numel() / BT;  // 64-byte aligned pieces where the width allows
  const int64_t width = std::min(vocab_rows_, fit >= 16 ? fit / 16 * 16 : fit);
  TRELLIS_CHECK(width > 0, "no scratch for the bf16 logits ({} floats for {} rows)",
                dqkv_.numel(), BT);
  const ops::GemmOperand w = head_weight();
  uint16_t* logits = ctx.logits_or_grad.bf16();
  float* part = dqkv_.f32();
  for (int64_t j0 = 0; j0 < vocab_rows_; j0 += width) {
    const int64_t n = std::min(width, vocab_rows_ - j0);
    const ops::GemmOperand wj = {w.f32 ? w.f32 + j0 * C_ : nullptr,
                                 w.bf16 ? w.bf16 + j0 * C_ : nullptr, w.ld};
    k_.gemm_operands(false, true, BT, n, C_, 1.0f, in.operand(C_), wj, 0.0f, part, n);
    for (int64_t i = 0; i < BT; ++i) k_.to_bf16(logits + i * vocab_rows_ + j0, part + i * n, n);
  }
}

void ModelChunk::as_head_output(std::vector<float>& logits) const {
  if (!bf16_) return;
  std::vector<uint16_t> bits(logits.size());
  k_.to_bf16(bits.data(), logits.data(), int64_t(logits.size()));
  for (size_t i = 0; i < bits.size(); ++i)
    logits[i] = std::bit_cast<float>(uint32_t(bits[i]) << 16);
}

ops::GemmOperand ModelChunk::head_weight() {
  if (head_copy_ >= 0)
    if (const uint16_t* w = copies_.get(k_, head_copy_)) return {nullptr, w, C_};
  return {head_w_, nullptr, C_};
}

void ModelChunk::start_pass() {
  if (copy_policy_ == WeightCopyPolicy::PerPass) copies_.changed();
}

void ModelChunk::set_weight_copies(WeightCopyPolicy policy) {
  copy_policy_ = policy;
  copies_.set_enabled(policy != WeightCopyPolicy::Off);
}

void ModelChunk::use_working_weights(const float* params, const uint16_t* bits) {
  TRELLIS_CHECK(bf16_, "bf16 working weights given to an fp32 model");
  copies_.use_working(params, bits);
}

int64_t ModelChunk::weight_copy_bytes() const {
  return bf16_ && copies_.enabled() && !copies_.working()
             ? copies_.elements() * int64_t(sizeof(uint16_t))
             : 0;
}

void ModelChunk::blocks_forward(Context& ctx) {
  run_hooks(&BlockHooks::before_forward, -1);
  if (chunk_.embedding) {
    const bool src = cfg_.encoder_decoder() && !ctx.src_tokens.empty();
    embed(src ? ctx.src_tokens.data() : ctx.tokens.data(), false, ctx.embedded.f32(), ctx);
    if (const ops::Dropout d = dropout_of(ctx, cfg_.dropout, 0, kEmbedDrop); d.p > 0.0f)
      drop_rows(ctx, ctx.embedded.f32(), ctx.embedded.f32(), nullptr, d);
  }
  for (size_t i = 0; i < chunk_.layers.size(); ++i) {
    run_hooks(&BlockHooks::before_forward, chunk_.layers[i]);
    if (decoder_start_ && chunk_.layers[i] == cfg_.n_layer)
      decoder_start_forward(ctx, i > 0 ? ctx.blocks[i - 1].res_out.f32()
                                       : (chunk_.embedding ? ctx.embedded.f32() : ctx.input.f32()));
    block_forward(ctx, int(i), block_input(ctx, int(i)));
    run_hooks(&BlockHooks::after_forward, chunk_.layers[i]);
  }
}

double ModelChunk::forward(Context& ctx, float grad_scale) {
  TRELLIS_REQUIRE(ctx.T <= cfg_.block_size, "sequence length {} exceeds the context length {}",
                  ctx.T, cfg_.block_size);
  for (int32_t n : ctx.lengths)
    TRELLIS_REQUIRE(n >= 1 && n <= ctx.T, "sequence length {} is outside [1, {}]", n, ctx.T);
  set_doc_positions(ctx);
  start_pass();
  ctx.dropping = ctx.dropout.train && grad_scale != 0.0f &&
                 (cfg_.dropout > 0.0f || cfg_.attn_dropout > 0.0f ||
                  (cfg_.classifier_dropout > 0.0f && !cfg_.lm_head()));
  blocks_forward(ctx);
  if (!chunk_.head) return 0.0;
  if (!cfg_.lm_head()) return classifier_forward(ctx, grad_scale);
  head_forward(ctx, ctx.blocks.back().res_out.f32());
  for (int32_t t : ctx.targets)  // -1: padding, not counted
    TRELLIS_REQUIRE(t >= -1 && t < cfg_.vocab_size, "target id {} is outside the vocabulary", t);
  // Smoothed over the true vocabulary of all tensor-parallel ranks (padding rows stay out).
  const float e = grad_scale != 0.0f ? label_smoothing_ : 0.0f;
  if (ctx.logits_or_grad.dtype() == DType::BF16)
    return k_.cross_entropy_bf16(ctx.logits_or_grad.bf16(), ctx.losses.f32(), ctx.targets.data(),
                                 ctx.B * ctx.T, vocab_valid_, vocab_rows_, vocab_start_, grad_scale,
                                 tp_.row_combine(), e, cfg_.vocab_size);
  return k_.cross_entropy(ctx.logits_or_grad.f32(), ctx.losses.f32(), ctx.targets.data(), ctx.B * ctx.T,
                          vocab_valid_, vocab_rows_, vocab_start_, grad_scale, tp_.row_combine(),
                          e, cfg_.vocab_size);
}

void ModelChunk::set_label_smoothing(float e) {
  TRELLIS_REQUIRE(e >= 0.0f && e < 1.0f, "label_smoothing {} is outside [0, 1)", e);
  label_smoothing_ = e;
}

void ModelChunk::set_doc_positions(Context& ctx) const {
  ctx.positions.clear();
  if (ctx.doc_start.empty()) return;
  TRELLIS_REQUIRE(cfg_.causal && !cfg_.encoder_decoder() && cfg_.lm_head(),
                  "document_mask needs a decoder-only language model (gpt2 or llama family)");
  const int64_t BT = ctx.B * ctx.T;
  TRELLIS_CHECK(int64_t(ctx.doc_start.size()) == BT, "doc_start holds {} entries, not {}",
                ctx.doc_start.size(), BT);
  ctx.positions.resize(size_t(BT));
  for (int64_t i = 0; i < BT; ++i)
    ctx.positions[size_t(i)] = int32_t(i % ctx.T) - ctx.doc_start[size_t(i)];
}

// dres holds d(res_out) on entry and d(mid) on exit (mid: the MLP's residual input).
void ModelChunk::mlp_backward(Context& ctx, int l, Context::BlockActs& a) {
  const int64_t BT = ctx.B * ctx.T, R = tp_.local_rows(BT), C = C_;
  const bool sp = tp_.sequence_parallel();
  const Block& p = blocks_[size_t(l)];
  float *dres = dres_.f32(), *dln = dln_.f32(), *dfull = dfull_.f32();
  float* dlocal = sp ? dfull : dln;           // where entering's backward leaves d(norm output)
  if (ctx.recompute == Recompute::Selective) {  // from the kept norm output (gathered under SP)
    mlp_forward(p, a, saved_input(a.ln2, a.ln2_full), BT);
  }
  const float* dbranch = branch_grad(ctx, dres, dln, p.layer, kMlpOutDrop);
  if (p.down.bias_grad()) k_.bias_backward(p.down.bias_grad(), dbranch, R, C, C);
  const float* dy = tp_.leave_backward(dbranch, dfull, BT, C);
  linear_backward(p.down, dact_.f32(), dy, rows_of(a.act), BT, false, a.ddown);
  k_.zero(dup_.f32(), BT * p.up.out());
  const bool swiglu = cfg_.mlp == MlpKind::SwiGLU;
  if (a.up.dtype() == DType::BF16 && swiglu)
    k_.swiglu_backward_bf16(dup_.f32(), a.up.bf16(), dact_.f32(), BT, Fl_);
  else if (a.up.dtype() == DType::BF16)
    k_.gelu_backward_bf16(dup_.f32(), a.up.bf16(), dact_.f32(), BT * Fl_);
  else if (swiglu)
    k_.swiglu_backward(dup_.f32(), a.up.f32(), dact_.f32(), BT, Fl_);
  else
    k_.gelu_backward(dup_.f32(), a.up.f32(), dact_.f32(), BT * Fl_);
  // (an fp32 a.up, read by the activation's backward above, is free to keep d(up) for a split
  // backward; a bf16 one is too narrow, so a split Context keeps it in a.dup)
  linear_backward(p.up, dln, dup_.f32(), saved_input(a.ln2, a.ln2_full), BT, true, kept_grad(a.up, a.dup));
  tp_.enter_backward(dln, dlocal, BT, C);
  p.ln2.backward(dres, dlocal, p.decoder ? a.res_x.f32() : a.res_mid.f32(), a.ln2_mean.f32(),
                 a.ln2_rstd.f32(), R);
}

void ModelChunk::block_backward(Context& ctx, int l, const float* x) {
  const int64_t BT = ctx.B * ctx.T, R = tp_.local_rows(BT), C = C_;
  const bool sp = tp_.sequence_parallel();
  const Block& p = blocks_[size_t(l)];
  Context::BlockActs view;
  Context::BlockActs& a = acts(ctx, l, view);
  float *dres = dres_.f32(), *dln = dln_.f32(), *dfull = dfull_.f32();
  float* dlocal = sp ? dfull : dln;  // where entering's backward leaves d(norm output)
  // Full recompute: the block's forward again, from its kept input into the workspace, with the
  // same tensor-parallel collectives in the same order on every rank (all but the last leave).
  if (ctx.recompute == Recompute::Full) block_forward(ctx, l, x, true);
  // dres holds d(res_out) on entry and d(x) on exit: the residual path is the identity and each
  // norm's backward adds its branch's contribution in place.
  if (!p.up.empty()) mlp_backward(ctx, l, a);
  if (p.decoder) cross_backward(ctx, l, a);

  const float* dbranch = branch_grad(ctx, dres, dln, p.layer, kAttnOutDrop);
  if (p.proj.bias_grad()) k_.bias_backward(p.proj.bias_grad(), dbranch, R, C, C);
  const float* dy = tp_.leave_backward(dbranch, dfull, BT, C);
  linear_backward(p.proj, datt_.f32(), dy, a.att.f32(), BT, false, a.dproj);
  const int64_t W = p.qkv.out(), Q = Hl_ * hd_, KV = Hkvl_ * hd_;
  float* dqkv = dqkv_.f32();
  k_.zero(dqkv, BT * W);
  if (a.qkv.dtype() == DType::BF16) {
    const uint16_t* qkv = a.qkv.bf16();
    k_.attention_backward_bf16(dqkv, dqkv + Q, dqkv + Q + KV, datt_.f32(), qkv, W, qkv + Q,
                               qkv + Q + KV, W, a.att.f32(), a.lse.f32(), attention_shape(ctx, p));
  } else {
    const float* qkv = a.qkv.f32();
    k_.attention_backward(dqkv, dqkv + Q, dqkv + Q + KV, datt_.f32(), qkv, W, qkv + Q,
                          qkv + Q + KV, W, a.att.f32(), a.lse.f32(), attention_shape(ctx, p));
  }
  if (cfg_.positions == PositionKind::Rope)
    k_.rope_backward(dqkv, W, BT, 0, ctx.T, Hl_ + Hkvl_, hd_, cfg_.rope_theta, doc_positions(ctx));
  // (an fp32 q|k|v, read by attention's backward above, is free to keep d(q|k|v) for a split
  // backward; a bf16 one is too narrow: a.dqkv)
  linear_backward(p.qkv, dln, dqkv, saved_input(a.ln1, a.ln1_full), BT, true,
                  kept_grad(a.qkv, a.dqkv));
  tp_.enter_backward(dln, dlocal, BT, C);
  p.ln1.backward(dres, dlocal, x, a.ln1_mean.f32(), a.ln1_rstd.f32(), R);
}

// dres holds d(res_x) on entry and d(res_mid) on exit; the encoder output's gradient adds to denc_.
void ModelChunk::cross_backward(Context& ctx, int l, Context::BlockActs& a) {
  const int64_t BT = ctx.B * ctx.T, R = tp_.local_rows(BT), C = C_, Q = Hl_ * hd_;
  const int64_t KV = Hkvl_ * hd_;
  const bool sp = tp_.sequence_parallel();
  const Block& p = blocks_[size_t(l)];
  float *dres = dres_.f32(), *dln = dln_.f32(), *dfull = dfull_.f32();
  const float* dbranch = branch_grad(ctx, dres, dln, p.layer, kCrossOutDrop);
  if (p.xproj.bias_grad()) k_.bias_backward(p.xproj.bias_grad(), dbranch, R, C, C);
  const float* dy = tp_.leave_backward(dbranch, dfull, BT, C);
  linear_backward(p.xproj, datt_.f32(), dy, a.xatt.f32(), BT, false, a.dxproj);
  k_.zero(dxq_.f32(), BT * Q);
  k_.zero(dxkv_.f32(), BT * 2 * KV);
  k_.attention_backward(dxq_.f32(), dxkv_.f32(), dxkv_.f32() + KV, datt_.f32(), a.xq.f32(), Q,
                        a.xkv.f32(), a.xkv.f32() + KV, 2 * KV, a.xatt.f32(), a.xlse.f32(),
                        cross_attention_shape(ctx, p));
  // Keys and values: gradient of the encoder output (summed over the decoder blocks).
  float* denc_full = denc_full_.f32();
  linear_backward(p.xkv, denc_full, dxkv_.f32(), sp ? a.enc_full.f32() : encoder_output(ctx), BT,
                  true, a.xkv);
  float* denc_local = sp ? dfull : denc_full;
  tp_.enter_backward(denc_full, denc_local, BT, C);
  k_.accumulate(denc_.f32(), denc_local, R * C);
  // Queries: through the cross-attention norm into the residual.
  linear_backward(p.xq, dln, dxq_.f32(), saved_input(a.lnx, a.lnx_full), BT, true, a.xq);
  float* dlocal = sp ? dfull : dln;
  tp_.enter_backward(dln, dlocal, BT, C);
  p.lnx.backward(dres, dlocal, a.res_mid.f32(), a.lnx_mean.f32(), a.lnx_rstd.f32(), R);
}

void ModelChunk::linear_backward(const Linear& lin, float* dx, const float* dy, Rows x,
                                 int64_t rows, bool bias_grad, Tensor& keep) const {
  if (!split_) return lin.backward(dx, dy, x, rows, bias_grad);
  lin.backward_input(dx, dy, rows);
  if (keep.f32() != dy) std::copy_n(dy, rows * lin.out(), keep.f32());
}

void ModelChunk::backward(Context& ctx, bool last_micro_step,
                          const std::function<void(int)>& on_block_done) {
  backward_pass(ctx, false, last_micro_step && on_block_done ? &on_block_done : nullptr);
}

void ModelChunk::backward_input(Context& ctx) {
  TRELLIS_CHECK(ctx.split_backward && ctx.recompute == Recompute::None,
                "backward_input needs a Context prepared for a split backward without recompute");
  split_ = true;
  backward_pass(ctx, true, nullptr);
  split_ = false;
}

void ModelChunk::backward_pass(Context& ctx, bool split, const std::function<void(int)>* notify) {
  TRELLIS_CHECK(blocks_[0].ln1.dweight() != nullptr,
                "backward on a model without gradient buffers");
  const int64_t BT = ctx.B * ctx.T, R = tp_.local_rows(BT), C = C_;
  const auto block_done = split ? &BlockHooks::after_input_backward : &BlockHooks::after_backward;
  run_hooks(&BlockHooks::before_backward, -1);
  if (chunk_.head) {
    head_backward(ctx);
  } else {
    std::copy_n(ctx.doutput.f32(), R * C, dres_.f32());
  }
  if (has_decoder_) {
    if (carry_out_)
      std::copy_n(ctx.doutput.f32() + R * C, R * C, denc_.f32());
    else
      k_.zero(denc_.f32(), R * C);
  }
  const int n = int(chunk_.layers.size());
  for (int i = n - 1; i >= 0; --i) {
    const Block& b = blocks_[size_t(i)];
    run_hooks(&BlockHooks::before_backward, b.layer);
    block_backward(ctx, i, block_input(ctx, i));
    if (decoder_start_ && b.layer == cfg_.n_layer) {
      // dres is d(decoder embedding): into the shared embedding and the decoder positions. Then
      // the encoder's side continues from d(encoder output) through its final norm.
      if (const ops::Dropout d = dropout_of(ctx, cfg_.dropout, 0, kDecEmbedDrop); d.p > 0.0f)
        drop_rows(ctx, dres_.f32(), dres_.f32(), nullptr, d);
      embed_backward(ctx.tokens.data(), ddec_pos_, ctx);
      k_.zero(dres_.f32(), R * C);
      const float* x_enc = i > 0 ? ctx.blocks[size_t(i - 1)].res_out.f32()
                                 : (chunk_.embedding ? ctx.embedded.f32() : ctx.input.f32());
      enc_norm_.backward(dres_.f32(), denc_.f32(), x_enc, ctx.enc_mean.f32(), ctx.enc_rstd.f32(),
                         R);
    }
    run_hooks(block_done, b.layer);
    if (notify) (*notify)(b.layer);
  }
  if (!chunk_.embedding) {
    std::copy_n(dres_.f32(), R * C, ctx.dinput.f32());
    if (carry_in_) std::copy_n(denc_.f32(), R * C, ctx.dinput.f32() + R * C);
    return;
  }
  const bool src = cfg_.encoder_decoder() && !ctx.src_tokens.empty();
  if (const ops::Dropout d = dropout_of(ctx, cfg_.dropout, 0, kEmbedDrop); d.p > 0.0f)
    drop_rows(ctx, dres_.f32(), dres_.f32(), nullptr, d);
  embed_backward(src ? ctx.src_tokens.data() : ctx.tokens.data(), dpos_, ctx);
  run_hooks(block_done, -1);
  if (notify) (*notify)(-1);
}

void ModelChunk::block_weights(Context& ctx, int l) {
  const int64_t BT = ctx.B * ctx.T;
  const bool sp = tp_.sequence_parallel();
  const Block& p = blocks_[size_t(l)];
  Context::BlockActs& a = ctx.blocks[size_t(l)];
  if (!p.up.empty()) {
    p.down.backward_weights(a.ddown.f32(), rows_of(a.act), BT, false);
    p.up.backward_weights(kept_grad(a.up, a.dup).f32(), saved_input(a.ln2, a.ln2_full), BT);
  }
  if (p.decoder) {
    p.xproj.backward_weights(a.dxproj.f32(), a.xatt.f32(), BT, false);
    p.xkv.backward_weights(a.xkv.f32(), sp ? a.enc_full.f32() : encoder_output(ctx), BT);
    p.xq.backward_weights(a.xq.f32(), saved_input(a.lnx, a.lnx_full), BT);
  }
  p.proj.backward_weights(a.dproj.f32(), a.att.f32(), BT, false);
  p.qkv.backward_weights(kept_grad(a.qkv, a.dqkv).f32(), saved_input(a.ln1, a.ln1_full), BT);
}

void ModelChunk::head_weights(Context& ctx, const uint16_t* dlogits16) {
  const int64_t BT = ctx.B * ctx.T;
  if (ctx.logits_or_grad.dtype() == DType::BF16) dlogits16 = ctx.logits_or_grad.bf16();
  const Rows lnf_in = saved_input(ctx.lnf, ctx.lnf_full);
  const ops::GemmOperand dlogits = {dlogits16 ? nullptr : ctx.logits_or_grad.f32(), dlogits16,
                                    vocab_rows_};
  k_.gemm_operands(true, false, vocab_rows_, C_, BT, 1.0f, dlogits, lnf_in.operand(C_), 1.0f,
                   dhead_w_, C_);
}

void ModelChunk::backward_weights(Context& ctx, bool last_micro_step,
                                  const std::function<void(int)>& on_block_done) {
  TRELLIS_CHECK(ctx.split_backward, "backward_weights of a Context without a split backward");
  const bool notify = last_micro_step && on_block_done;
  // The classifier's head is small and stays whole in backward_input.
  if (chunk_.head && cfg_.lm_head() && defers_head()) head_weights(ctx);
  for (int i = int(chunk_.layers.size()) - 1; i >= 0; --i) {
    block_weights(ctx, i);
    run_hooks(&BlockHooks::after_backward, blocks_[size_t(i)].layer);
    if (notify) on_block_done(blocks_[size_t(i)].layer);
  }
  // As backward: the root's hooks close a chunk that holds the embeddings.
  if (!chunk_.embedding) return;
  run_hooks(&BlockHooks::after_backward, -1);
  if (notify) on_block_done(-1);
}

int64_t ModelChunk::length(const Context& ctx, int64_t b) const {
  return ctx.lengths.empty() ? ctx.T : ctx.lengths[size_t(b)];
}

float ModelChunk::pool_weight(const Context& ctx, int64_t b, int64_t t) const {
  const int64_t n = length(ctx, b);
  switch (cfg_.pooling) {
    case Pooling::Mean:
      return t < n ? 1.0f / float(n) : 0.0f;
    case Pooling::Cls:
      return t == 0 ? 1.0f : 0.0f;
    case Pooling::Last:
      return t == n - 1 ? 1.0f : 0.0f;
  }
  return 0.0f;
}

// Final norm, pooling over each sequence's real positions, the classifier, and cross-entropy over
// the classes. The head is replicated: every tensor-parallel rank holds all rows (no sequence
// parallelism) and computes the same values.
double ModelChunk::classifier_forward(Context& ctx, float grad_scale) {
  const int64_t B = ctx.B, T = ctx.T, C = C_, K = cfg_.num_classes;
  lnf_.forward(ctx.lnf.f32(), ctx.lnf_mean.f32(), ctx.lnf_rstd.f32(),
               ctx.blocks.back().res_out.f32(), B * T);
  float* pooled = ctx.pooled.f32();
  std::fill_n(pooled, B * C, 0.0f);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      if (const float w = pool_weight(ctx, b, t); w != 0.0f)
        for (int64_t c = 0; c < C; ++c) pooled[b * C + c] += w * ctx.lnf.f32()[(b * T + t) * C + c];
  // Dropped in place: the classifier's weight gradient reads the dropped vector.
  if (const ops::Dropout d = dropout_of(ctx, cfg_.classifier_dropout, 0, kClassifierDrop);
      d.p > 0.0f)
    k_.dropout(pooled, pooled, nullptr, B, 0, 1, C, d);  // sequence b, position 0, element c
  float* logits = ctx.class_logits_or_grad.f32();
  classifier_.forward(logits, pooled, B);
  for (int64_t b = 0; b < B; ++b) {
    TRELLIS_REQUIRE(ctx.labels[size_t(b)] >= -1 && ctx.labels[size_t(b)] < K,
                    "label {} is outside the {} classes", ctx.labels[size_t(b)], K);
    ctx.predictions[size_t(b)] =
        int32_t(std::max_element(logits + b * K, logits + b * K + K) - (logits + b * K));
  }
  std::vector<float> losses(static_cast<size_t>(B));
  const double sum =
      k_.cross_entropy(logits, losses.data(), ctx.labels.data(), B, K, K, 0, grad_scale, {},
                       grad_scale != 0.0f ? label_smoothing_ : 0.0f, K);
  float* out = ctx.losses.f32();
  std::fill_n(out, B * T, 0.0f);
  for (int64_t b = 0; b < B; ++b) out[b * T] = losses[size_t(b)];
  return sum;
}

void ModelChunk::classifier_backward(Context& ctx) {
  const int64_t B = ctx.B, T = ctx.T, C = C_;
  std::vector<float> dpooled(size_t(B * C), 0.0f);
  classifier_.backward(dpooled.data(), ctx.class_logits_or_grad.f32(), ctx.pooled.f32(), B);
  if (const ops::Dropout d = dropout_of(ctx, cfg_.classifier_dropout, 0, kClassifierDrop);
      d.p > 0.0f)
    k_.dropout(dpooled.data(), dpooled.data(), nullptr, B, 0, 1, C, d);
  float* dln = dln_.f32();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const float w = pool_weight(ctx, b, t);
      for (int64_t c = 0; c < C; ++c) dln[(b * T + t) * C + c] = w * dpooled[size_t(b * C + c)];
    }
  k_.zero(dres_.f32(), B * T * C);
  lnf_.backward(dres_.f32(), dln, ctx.blocks.back().res_out.f32(), ctx.lnf_mean.f32(),
                ctx.lnf_rstd.f32(), B * T);
}

void ModelChunk::head_backward(Context& ctx) {
  if (!cfg_.lm_head()) return classifier_backward(ctx);
  const int64_t BT = ctx.B * ctx.T, R = tp_.local_rows(BT), C = C_;
  const bool sp = tp_.sequence_parallel();
  // ctx.logits_or_grad holds dlogits (fused into the loss).
  float* dln = dln_.f32();
  // bf16: dlogits are kept in bf16 where the logits were (the loss wrote them rounded); else,
  // in a bf16 model, rounded once when both GEMMs that read them run here.
  const bool both = !split_ || !defers_head();
  const uint16_t* dlogits16 =
      ctx.logits_or_grad.dtype() == DType::BF16 ? ctx.logits_or_grad.bf16()
      : bf16_ && both ? copies_.round_once(k_, ctx.logits_or_grad.f32(), BT * vocab_rows_)
                      : nullptr;
  const ops::GemmOperand dlogits = {dlogits16 ? nullptr : ctx.logits_or_grad.f32(), dlogits16,
                                    vocab_rows_};
  k_.gemm_operands(false, false, BT, C, vocab_rows_, 1.0f, dlogits, head_weight(), 0.0f, dln, C);
  if (both) head_weights(ctx, dlogits16);
  float* dlocal = sp ? dfull_.f32() : dln;
  tp_.enter_backward(dln, dlocal, BT, C);
  k_.zero(dres_.f32(), R * C);
  lnf_.backward(dres_.f32(), dlocal, ctx.blocks.back().res_out.f32(), ctx.lnf_mean.f32(),
                ctx.lnf_rstd.f32(), R);
}

std::vector<float> ModelChunk::logits_at(Context& ctx, const std::vector<int64_t>& rows) {
  TRELLIS_CHECK(tp_.size() == 1 && chunk_.embedding && chunk_.head && cfg_.lm_head(),
                "decoding runs the whole language model on a single rank");
  ctx.dropping = false;
  start_pass();
  blocks_forward(ctx);
  const int64_t C = C_, V = cfg_.vocab_size, n = int64_t(rows.size());
  const float* hidden = ctx.blocks.back().res_out.f32();
  std::vector<float> picked(size_t(n * C)), ln(size_t(n * C)), logits(size_t(n * V));
  std::vector<float> mean(static_cast<size_t>(n)), rstd(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    std::copy_n(hidden + rows[size_t(i)] * C, C, picked.data() + i * C);
  lnf_.forward(ln.data(), mean.data(), rstd.data(), picked.data(), n);
  k_.gemm_operands(false, true, n, V, C, 1.0f, {ln.data(), nullptr, C}, head_weight(), 0.0f,
                   logits.data(), V);
  as_head_output(logits);
  return logits;
}

int64_t weight_copy_bytes(const ParamLayout& layout, const StageSpec& chunk) {
  const ModelConfig& cfg = layout.config();
  const ChunkRole role = chunk_role(cfg, chunk);
  const auto in_chunk = [&](int layer) {
    return std::find(chunk.layers.begin(), chunk.layers.end(), layer) != chunk.layers.end();
  };
  int64_t n = 0;
  for (const ParamSpec& s : layout.specs()) {
    if (s.bias) continue;
    switch (s.slot) {
      case Slot::Qkv: case Slot::Q: case Slot::K: case Slot::V: case Slot::AttnOut:
      case Slot::CrossQ: case Slot::CrossK: case Slot::CrossV: case Slot::CrossOut:
      case Slot::MlpUp: case Slot::Gate: case Slot::Up: case Slot::MlpDown:
        if (in_chunk(s.layer)) n += int64_t(s.numel());
        break;
      case Slot::FeatureEmbed:
        if (chunk.embedding) n += int64_t(s.numel());
        break;
      case Slot::Classifier:
        if (chunk.head && !cfg.lm_head()) n += int64_t(s.numel());
        break;
      case Slot::Head:  // an untied head; a tied one multiplies the token embedding
        if (chunk.head && cfg.lm_head()) n += int64_t(s.numel());
        break;
      case Slot::TokEmbed:  // one copy for a tied head and the lookup
        if ((chunk.head && cfg.tied_lm_head()) ||
            (cfg.bf16_embeddings &&
             ((chunk.embedding && cfg.input_features == 0) || role.decoder_start)))
          n += int64_t(s.numel());
        break;
      case Slot::PosEmbed:
      case Slot::NgramEmbed:
        if (cfg.bf16_embeddings && chunk.embedding) n += int64_t(s.numel());
        break;
      case Slot::DecPosEmbed:
        if (cfg.bf16_embeddings && role.decoder_start) n += int64_t(s.numel());
        break;
      default:
        break;
    }
  }
  return n * int64_t(sizeof(uint16_t));
}

ModelChunk::WeightCopyPolicy training_weight_copies(int zero) {
  return zero >= 3 ? ModelChunk::WeightCopyPolicy::Off : ModelChunk::WeightCopyPolicy::UntilChanged;
}

namespace {
// The tables a lookup reads: token, learned position, decoder position, n-gram embeddings.
bool lookup_table(Slot slot) {
  return slot == Slot::TokEmbed || slot == Slot::PosEmbed || slot == Slot::DecPosEmbed ||
         slot == Slot::NgramEmbed;
}
}  // namespace

bool read_as_bf16_only(const ParamSpec& s, const ModelConfig& cfg) {
  if (s.bias) return false;
  // clang-format off
  switch (s.slot) {
    case Slot::Qkv: case Slot::Q: case Slot::K: case Slot::V: case Slot::AttnOut:
    case Slot::CrossQ: case Slot::CrossK: case Slot::CrossV: case Slot::CrossOut:
    case Slot::MlpUp: case Slot::Gate: case Slot::Up: case Slot::MlpDown:
    case Slot::FeatureEmbed: case Slot::Classifier: case Slot::Head:
      return true;
    default:
      return cfg.bf16_embeddings && lookup_table(s.slot);
  }
  // clang-format on
}

std::vector<FlatRange> fp32_read_ranges(const ParamLayout& layout) {
  std::vector<FlatRange> r;
  for (const ParamSpec& s : layout.specs())
    if (!read_as_bf16_only(s, layout.config()) && s.numel() > 0)
      r.push_back({s.offset, s.offset + s.numel()});
  std::sort(r.begin(), r.end(),
            [](const FlatRange& a, const FlatRange& b) { return a.begin < b.begin; });
  std::vector<FlatRange> merged;
  for (const FlatRange& x : r)
    if (!merged.empty() && x.begin <= merged.back().end)
      merged.back().end = std::max(merged.back().end, x.end);
    else
      merged.push_back(x);
  return merged;
}

double flops_per_token(const ModelConfig& cfg, int64_t n_params, int64_t T) {
  // An encoder-decoder's decoder blocks attend twice (self and cross).
  const double attention_blocks = cfg.total_layers() + cfg.n_dec_layer;
  return 6.0 * double(n_params) + 12.0 * attention_blocks * double(cfg.n_embd) * double(T);
}

}  // namespace trellis
