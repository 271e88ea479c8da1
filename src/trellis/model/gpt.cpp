#include "trellis/model/gpt.h"

#include <algorithm>

#include "trellis/core/error.h"
#include "trellis/kernels/ops.h"

namespace trellis {

namespace {
void fit(std::vector<float>& v, int64_t n) { v.resize(size_t(n)); }
void zero(std::vector<float>& v) { ops::zero(v.data(), int64_t(v.size())); }
}  // namespace

GPT::GPT(const ModelConfig& cfg, const ParamLayout& layout, float* params, float* grads,
         TensorParallel& tp, const StageSpec* chunk)
    : cfg_(cfg), chunk_(chunk ? *chunk : layout.stage()), tp_(tp) {
  cfg_.validate();
  TRELLIS_CHECK(layout.tp() == tp.size() && layout.tp_rank() == tp.rank(),
                "parameter layout is for tp rank {}/{}, the group is {}/{}", layout.tp_rank(),
                layout.tp(), tp.rank(), tp.size());
  C_ = cfg.n_embd;
  Cl_ = C_ / tp.size();
  Hl_ = cfg.n_head / tp.size();
  vocab_rows_ = layout.vocab_local();
  vocab_start_ = layout.vocab_start();
  vocab_valid_ = std::clamp<int64_t>(cfg.vocab_size - vocab_start_, 0, vocab_rows_);
  TRELLIS_CHECK(!chunk_.layers.empty(), "a model chunk needs at least one block");
  auto p = [&](const std::string& n) { return params + layout.spec(n).offset; };
  auto g = [&](const std::string& n) { return grads ? grads + layout.spec(n).offset : nullptr; };
  if (chunk_.embedding || chunk_.head) wte_ = p("wte.weight"), dwte_ = g("wte.weight");
  if (chunk_.embedding) wpe_ = p("wpe.weight"), dwpe_ = g("wpe.weight");
  if (chunk_.head) {
    lnf_w_ = p("ln_f.weight"), lnf_b_ = p("ln_f.bias");
    dlnf_w_ = g("ln_f.weight"), dlnf_b_ = g("ln_f.bias");
  }
  for (int l : chunk_.layers) {
    const std::string h = "h." + std::to_string(l) + ".";
    blocks_.push_back({p(h + "ln_1.weight"), p(h + "ln_1.bias"), p(h + "attn.c_attn.weight"),
                       p(h + "attn.c_attn.bias"), p(h + "attn.c_proj.weight"),
                       p(h + "attn.c_proj.bias"), p(h + "ln_2.weight"), p(h + "ln_2.bias"),
                       p(h + "mlp.c_fc.weight"), p(h + "mlp.c_fc.bias"), p(h + "mlp.c_proj.weight"),
                       p(h + "mlp.c_proj.bias")});
    dblocks_.push_back({g(h + "ln_1.weight"), g(h + "ln_1.bias"), g(h + "attn.c_attn.weight"),
                        g(h + "attn.c_attn.bias"), g(h + "attn.c_proj.weight"),
                        g(h + "attn.c_proj.bias"), g(h + "ln_2.weight"), g(h + "ln_2.bias"),
                        g(h + "mlp.c_fc.weight"), g(h + "mlp.c_fc.bias"),
                        g(h + "mlp.c_proj.weight"), g(h + "mlp.c_proj.bias")});
  }
}

void GPT::prepare(Context& ctx, int64_t B, int64_t T) {
  const int64_t BT = B * T, R = tp_.local_rows(BT), C = C_, Cl = Cl_;
  TRELLIS_REQUIRE(!tp_.sequence_parallel() || BT % tp_.size() == 0,
                  "sequence parallelism needs batch x sequence rows ({}) divisible by tp={}", BT,
                  tp_.size());
  const int64_t full = tp_.sequence_parallel() ? BT * C : 0;  // gathered copies (SP only)
  ctx.B = B;
  ctx.T = T;
  ctx.tokens.resize(size_t(BT));
  ctx.targets.resize(size_t(BT));
  ctx.blocks.resize(chunk_.layers.size());
  for (auto& a : ctx.blocks) {
    fit(a.ln1, R * C), fit(a.ln1_mean, R), fit(a.ln1_rstd, R), fit(a.ln1_full, full);
    fit(a.qkv, BT * 3 * Cl), fit(a.probs, B * Hl_ * T * T), fit(a.att, BT * Cl);
    fit(a.res_mid, R * C), fit(a.ln2, R * C), fit(a.ln2_mean, R), fit(a.ln2_rstd, R);
    fit(a.ln2_full, full), fit(a.fc, BT * 4 * Cl), fit(a.gelu, BT * 4 * Cl), fit(a.res_out, R * C);
  }
  const bool head = chunk_.head, embedding = chunk_.embedding;
  fit(ctx.lnf, head ? R * C : 0), fit(ctx.lnf_mean, head ? R : 0), fit(ctx.lnf_rstd, head ? R : 0);
  fit(ctx.lnf_full, head ? full : 0);
  fit(ctx.logits, head ? BT * vocab_rows_ : 0), fit(ctx.losses, BT);
  fit(ctx.embedded, embedding ? R * C : 0);
  fit(ctx.input, embedding ? 0 : R * C), fit(ctx.dinput, embedding ? 0 : R * C);
  fit(ctx.doutput, head ? 0 : R * C);
  if (int64_t(full_.size()) < BT * C) {
    fit(full_, BT * C), fit(dres_, R * C), fit(dln_, BT * C), fit(dfull_, BT * C);
    fit(dqkv_, BT * 3 * Cl), fit(datt_, BT * Cl), fit(dfc_, BT * 4 * Cl), fit(dgelu_, BT * 4 * Cl);
  }
}

void GPT::embedding_forward(Context& ctx) {
  const int64_t BT = ctx.B * ctx.T;
  for (int32_t t : ctx.tokens)
    TRELLIS_REQUIRE(t >= 0 && t < cfg_.vocab_size,
                    "token id {} is outside the vocabulary (size {})", t, cfg_.vocab_size);
  // Each rank looks up the tokens of its vocabulary slice; leaving the region sums the slices.
  float* lookup = tp_.sequence_parallel() ? full_.data() : ctx.embedded.data();
  ops::embedding_forward(lookup, ctx.tokens.data(), wte_, vocab_start_, vocab_rows_, BT, C_);
  tp_.leave(lookup, ctx.embedded.data(), BT, C_);
  ops::position_forward(ctx.embedded.data(), wpe_, tp_.first_row(BT), tp_.local_rows(BT), ctx.T,
                        C_);
}

void GPT::block_forward(Context& ctx, int l, const float* x) {
  const int64_t BT = ctx.B * ctx.T, R = tp_.local_rows(BT), C = C_, Cl = Cl_;
  const bool sp = tp_.sequence_parallel();
  const BlockParams& p = blocks_[size_t(l)];
  Context::BlockActs& a = ctx.blocks[size_t(l)];
  // Attention: heads split across the group (QKV column-parallel, projection row-parallel).
  ops::layernorm_forward(a.ln1.data(), a.ln1_mean.data(), a.ln1_rstd.data(), x, p.ln1_w, p.ln1_b, R,
                         C);
  const float* in = tp_.enter(a.ln1.data(), a.ln1_full.data(), BT, C);
  ops::linear_forward(a.qkv.data(), in, p.attn_w, p.attn_b, BT, C, 3 * Cl);
  ops::attention_forward(a.att.data(), a.probs.data(), a.qkv.data(), ctx.B, ctx.T, Cl, Hl_);
  float* partial = sp ? full_.data() : a.res_mid.data();
  ops::linear_forward(partial, a.att.data(), p.proj_w, nullptr, BT, Cl, C);
  tp_.leave(partial, a.res_mid.data(), BT, C);
  ops::add_bias(a.res_mid.data(), p.proj_b, x, R, C);
  // MLP: c_fc column-parallel, c_proj row-parallel.
  ops::layernorm_forward(a.ln2.data(), a.ln2_mean.data(), a.ln2_rstd.data(), a.res_mid.data(),
                         p.ln2_w, p.ln2_b, R, C);
  in = tp_.enter(a.ln2.data(), a.ln2_full.data(), BT, C);
  ops::linear_forward(a.fc.data(), in, p.fc_w, p.fc_b, BT, C, 4 * Cl);
  ops::gelu_forward(a.gelu.data(), a.fc.data(), BT * 4 * Cl);
  partial = sp ? full_.data() : a.res_out.data();
  ops::linear_forward(partial, a.gelu.data(), p.mlp_proj_w, nullptr, BT, 4 * Cl, C);
  tp_.leave(partial, a.res_out.data(), BT, C);
  ops::add_bias(a.res_out.data(), p.mlp_proj_b, a.res_mid.data(), R, C);
}

void GPT::head_forward(Context& ctx, const float* x) {
  const int64_t BT = ctx.B * ctx.T, R = tp_.local_rows(BT);
  ops::layernorm_forward(ctx.lnf.data(), ctx.lnf_mean.data(), ctx.lnf_rstd.data(), x, lnf_w_,
                         lnf_b_, R, C_);
  const float* in = tp_.enter(ctx.lnf.data(), ctx.lnf_full.data(), BT, C_);
  // logits over this rank's vocabulary slice (padding rows are zero and masked in the loss).
  ops::gemm(false, true, BT, vocab_rows_, C_, 1.0f, in, C_, wte_, C_, 0.0f, ctx.logits.data(),
            vocab_rows_);
}

double GPT::forward(Context& ctx, float grad_scale) {
  TRELLIS_REQUIRE(ctx.T <= cfg_.block_size, "sequence length {} exceeds the context length {}",
                  ctx.T, cfg_.block_size);
  const float* x = ctx.input.data();
  if (chunk_.embedding) {
    embedding_forward(ctx);
    x = ctx.embedded.data();
  }
  for (size_t i = 0; i < chunk_.layers.size(); ++i) {
    block_forward(ctx, int(i), x);
    x = ctx.blocks[i].res_out.data();
  }
  if (!chunk_.head) return 0.0;
  head_forward(ctx, x);
  for (int32_t t : ctx.targets)
    TRELLIS_REQUIRE(t >= 0 && t < cfg_.vocab_size, "target id {} is outside the vocabulary", t);
  return ops::cross_entropy(ctx.logits.data(), ctx.losses.data(), ctx.targets.data(), ctx.B * ctx.T,
                            vocab_valid_, vocab_rows_, vocab_start_, grad_scale, tp_.row_combine());
}

void GPT::block_backward(Context& ctx, int l, const float* x) {
  const int64_t BT = ctx.B * ctx.T, R = tp_.local_rows(BT), C = C_, Cl = Cl_;
  const bool sp = tp_.sequence_parallel();
  const BlockParams& p = blocks_[size_t(l)];
  const BlockGrads& g = dblocks_[size_t(l)];
  Context::BlockActs& a = ctx.blocks[size_t(l)];
  float* dlocal = sp ? dfull_.data() : dln_.data();  // where entering's backward leaves d(ln)
  // dres_ holds d(res_out) on entry and d(x) on exit: the residual path is the identity and each
  // LayerNorm backward adds its branch's contribution in place.
  ops::bias_backward(g.mlp_proj_b, dres_.data(), R, C);
  const float* dy = tp_.leave_backward(dres_.data(), dfull_.data(), BT, C);
  zero(dgelu_);
  ops::linear_backward(dgelu_.data(), g.mlp_proj_w, nullptr, dy, a.gelu.data(), p.mlp_proj_w, BT,
                       4 * Cl, C);
  zero(dfc_);
  ops::gelu_backward(dfc_.data(), a.fc.data(), dgelu_.data(), BT * 4 * Cl);
  zero(dln_);
  ops::linear_backward(dln_.data(), g.fc_w, g.fc_b, dfc_.data(),
                       sp ? a.ln2_full.data() : a.ln2.data(), p.fc_w, BT, C, 4 * Cl);
  tp_.enter_backward(dln_.data(), dlocal, BT, C);
  ops::layernorm_backward(dres_.data(), g.ln2_w, g.ln2_b, dlocal, a.res_mid.data(), p.ln2_w,
                          a.ln2_mean.data(), a.ln2_rstd.data(), R, C);

  ops::bias_backward(g.proj_b, dres_.data(), R, C);
  dy = tp_.leave_backward(dres_.data(), dfull_.data(), BT, C);
  zero(datt_);
  ops::linear_backward(datt_.data(), g.proj_w, nullptr, dy, a.att.data(), p.proj_w, BT, Cl, C);
  zero(dqkv_);
  ops::attention_backward(dqkv_.data(), datt_.data(), a.qkv.data(), a.probs.data(), ctx.B, ctx.T,
                          Cl, Hl_);
  zero(dln_);
  ops::linear_backward(dln_.data(), g.attn_w, g.attn_b, dqkv_.data(),
                       sp ? a.ln1_full.data() : a.ln1.data(), p.attn_w, BT, C, 3 * Cl);
  tp_.enter_backward(dln_.data(), dlocal, BT, C);
  ops::layernorm_backward(dres_.data(), g.ln1_w, g.ln1_b, dlocal, x, p.ln1_w, a.ln1_mean.data(),
                          a.ln1_rstd.data(), R, C);
}

void GPT::reduce_replicated(std::initializer_list<std::pair<float*, int64_t>> grads) {
  for (const auto& [ptr, n] : grads) tp_.all_reduce(ptr, n);
}

void GPT::backward(Context& ctx, bool last_micro_step,
                   const std::function<void(int)>& on_block_done) {
  TRELLIS_CHECK(dblocks_[0].ln1_w != nullptr, "backward on a model without gradient buffers");
  const int64_t BT = ctx.B * ctx.T, R = tp_.local_rows(BT), C = C_;
  const bool reduce = tp_.sequence_parallel() && last_micro_step;
  const bool notify = last_micro_step && on_block_done;
  if (chunk_.head) {
    head_backward(ctx, reduce);
  } else {
    std::copy_n(ctx.doutput.begin(), R * C, dres_.begin());
  }
  const int n = int(chunk_.layers.size());
  for (int i = n - 1; i >= 0; --i) {
    const float* x = i > 0 ? ctx.blocks[size_t(i - 1)].res_out.data()
                           : (chunk_.embedding ? ctx.embedded.data() : ctx.input.data());
    block_backward(ctx, i, x);
    if (reduce) {
      const BlockGrads& g = dblocks_[size_t(i)];
      reduce_replicated({{g.ln1_w, C},
                         {g.ln1_b, C},
                         {g.proj_b, C},
                         {g.ln2_w, C},
                         {g.ln2_b, C},
                         {g.mlp_proj_b, C}});
    }
    if (notify) on_block_done(chunk_.layers[size_t(i)]);
  }
  if (!chunk_.embedding) {
    std::copy_n(dres_.begin(), R * C, ctx.dinput.begin());
    return;
  }
  ops::position_backward(dwpe_, dres_.data(), tp_.first_row(BT), R, ctx.T, C);
  if (reduce) reduce_replicated({{dwpe_, int64_t(cfg_.block_size) * C}});
  const float* dfull = tp_.leave_backward(dres_.data(), dfull_.data(), BT, C);
  ops::embedding_backward(dwte_, dfull, ctx.tokens.data(), vocab_start_, vocab_rows_, BT, C);
  if (notify) on_block_done(-1);
}

void GPT::head_backward(Context& ctx, bool reduce) {
  const int64_t BT = ctx.B * ctx.T, R = tp_.local_rows(BT), C = C_;
  const bool sp = tp_.sequence_parallel();
  // ctx.logits already hold dlogits (fused into the loss).
  const float* lnf_in = sp ? ctx.lnf_full.data() : ctx.lnf.data();
  ops::gemm(false, false, BT, C, vocab_rows_, 1.0f, ctx.logits.data(), vocab_rows_, wte_, C, 0.0f,
            dln_.data(), C);
  ops::gemm(true, false, vocab_rows_, C, BT, 1.0f, ctx.logits.data(), vocab_rows_, lnf_in, C, 1.0f,
            dwte_, C);
  float* dlocal = sp ? dfull_.data() : dln_.data();
  tp_.enter_backward(dln_.data(), dlocal, BT, C);
  std::fill_n(dres_.begin(), R * C, 0.0f);
  const float* x_last = ctx.blocks.back().res_out.data();
  ops::layernorm_backward(dres_.data(), dlnf_w_, dlnf_b_, dlocal, x_last, lnf_w_,
                          ctx.lnf_mean.data(), ctx.lnf_rstd.data(), R, C);
  if (reduce) reduce_replicated({{dlnf_w_, C}, {dlnf_b_, C}});
}

std::vector<float> GPT::last_logits(Context& ctx) {
  TRELLIS_CHECK(tp_.size() == 1 && chunk_.embedding && chunk_.head,
                "sampling runs the whole model on a single rank");
  embedding_forward(ctx);
  const float* x = ctx.embedded.data();
  for (size_t i = 0; i < chunk_.layers.size(); ++i) {
    block_forward(ctx, int(i), x);
    x = ctx.blocks[i].res_out.data();
  }
  const int64_t C = C_, V = cfg_.vocab_size, last = ctx.T - 1;
  ops::layernorm_forward(ctx.lnf.data(), ctx.lnf_mean.data(), ctx.lnf_rstd.data(), x + last * C,
                         lnf_w_, lnf_b_, 1, C);
  std::vector<float> logits(static_cast<size_t>(V));
  ops::gemm(false, true, 1, V, C, 1.0f, ctx.lnf.data(), C, wte_, C, 0.0f, logits.data(), V);
  return logits;
}

double flops_per_token(const ModelConfig& cfg, int64_t n_params, int64_t T) {
  return 6.0 * double(n_params) + 12.0 * cfg.n_layer * double(cfg.n_embd) * double(T);
}

}  // namespace trellis
