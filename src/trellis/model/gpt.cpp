#include "trellis/model/gpt.h"

#include <algorithm>
#include <cstring>

#include "trellis/core/error.h"
#include "trellis/kernels/ops.h"

namespace trellis {

namespace {
void fit(std::vector<float>& v, int64_t n) { v.resize(size_t(n)); }
void zero(std::vector<float>& v) { std::fill(v.begin(), v.end(), 0.0f); }
}  // namespace

void Context::resize(const ModelConfig& cfg, int64_t b, int64_t t) {
  if (B == b && T == t && int(blocks.size()) == cfg.n_layer) return;
  B = b;
  T = t;
  const int64_t BT = b * t, C = cfg.n_embd, H = cfg.n_head;
  tokens.resize(size_t(BT));
  targets.resize(size_t(BT));
  fit(embedded, BT * C);
  blocks.resize(size_t(cfg.n_layer));
  for (auto& a : blocks) {
    fit(a.ln1, BT * C), fit(a.ln1_mean, BT), fit(a.ln1_rstd, BT), fit(a.qkv, BT * 3 * C);
    fit(a.probs, b * H * t * t), fit(a.att, BT * C), fit(a.res_mid, BT * C);
    fit(a.ln2, BT * C), fit(a.ln2_mean, BT), fit(a.ln2_rstd, BT), fit(a.fc, BT * 4 * C);
    fit(a.gelu, BT * 4 * C), fit(a.res_out, BT * C);
  }
  fit(lnf, BT * C), fit(lnf_mean, BT), fit(lnf_rstd, BT);
  fit(logits, BT * cfg.padded_vocab()), fit(losses, BT);
}

void BackwardScratch::resize(const ModelConfig& cfg, int64_t BT) {
  const int64_t C = cfg.n_embd;
  if (int64_t(dres.size()) == BT * C) return;
  fit(dres, BT * C), fit(dln, BT * C), fit(dqkv, BT * 3 * C), fit(datt, BT * C);
  fit(dfc, BT * 4 * C), fit(dgelu, BT * 4 * C);
}

GPT::GPT(const ModelConfig& cfg, const ParamLayout& layout, float* params, float* grads)
    : cfg_(cfg) {
  cfg_.validate();
  auto p = [&](const std::string& n) { return params + layout.spec(n).offset; };
  auto g = [&](const std::string& n) { return grads ? grads + layout.spec(n).offset : nullptr; };
  wte_ = p("wte.weight"), wpe_ = p("wpe.weight");
  lnf_w_ = p("ln_f.weight"), lnf_b_ = p("ln_f.bias");
  dwte_ = g("wte.weight"), dwpe_ = g("wpe.weight");
  dlnf_w_ = g("ln_f.weight"), dlnf_b_ = g("ln_f.bias");
  for (int l = 0; l < cfg.n_layer; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    blocks_.push_back({p(h + "ln_1.weight"), p(h + "ln_1.bias"), p(h + "attn.c_attn.weight"),
                       p(h + "attn.c_attn.bias"), p(h + "attn.c_proj.weight"),
                       p(h + "attn.c_proj.bias"), p(h + "ln_2.weight"), p(h + "ln_2.bias"),
                       p(h + "mlp.c_fc.weight"), p(h + "mlp.c_fc.bias"),
                       p(h + "mlp.c_proj.weight"), p(h + "mlp.c_proj.bias")});
    dblocks_.push_back({g(h + "ln_1.weight"), g(h + "ln_1.bias"), g(h + "attn.c_attn.weight"),
                        g(h + "attn.c_attn.bias"), g(h + "attn.c_proj.weight"),
                        g(h + "attn.c_proj.bias"), g(h + "ln_2.weight"), g(h + "ln_2.bias"),
                        g(h + "mlp.c_fc.weight"), g(h + "mlp.c_fc.bias"),
                        g(h + "mlp.c_proj.weight"), g(h + "mlp.c_proj.bias")});
  }
}

void GPT::embedding_forward(Context& ctx) {
  const int64_t V = cfg_.vocab_size;
  for (int32_t t : ctx.tokens)
    TRELLIS_REQUIRE(t >= 0 && t < V, "token id {} is outside the vocabulary (size {})", t, V);
  ops::embedding_forward(ctx.embedded.data(), ctx.tokens.data(), wte_, wpe_, ctx.B, ctx.T,
                         cfg_.n_embd);
}

void GPT::block_forward(Context& ctx, int l, const float* x) {
  const int64_t BT = ctx.B * ctx.T, C = cfg_.n_embd;
  const BlockParams& p = blocks_[size_t(l)];
  Context::BlockActs& a = ctx.blocks[size_t(l)];
  ops::layernorm_forward(a.ln1.data(), a.ln1_mean.data(), a.ln1_rstd.data(), x, p.ln1_w, p.ln1_b,
                         BT, C);
  ops::linear_forward(a.qkv.data(), a.ln1.data(), p.attn_w, p.attn_b, BT, C, 3 * C);
  ops::attention_forward(a.att.data(), a.probs.data(), a.qkv.data(), ctx.B, ctx.T, C,
                         cfg_.n_head);
  // res_mid = x + att @ proj: the projection writes into res_mid, then the residual is added.
  ops::linear_forward(a.res_mid.data(), a.att.data(), p.proj_w, p.proj_b, BT, C, C);
  ops::accumulate(a.res_mid.data(), x, BT * C);
  ops::layernorm_forward(a.ln2.data(), a.ln2_mean.data(), a.ln2_rstd.data(), a.res_mid.data(),
                         p.ln2_w, p.ln2_b, BT, C);
  ops::linear_forward(a.fc.data(), a.ln2.data(), p.fc_w, p.fc_b, BT, C, 4 * C);
  ops::gelu_forward(a.gelu.data(), a.fc.data(), BT * 4 * C);
  ops::linear_forward(a.res_out.data(), a.gelu.data(), p.mlp_proj_w, p.mlp_proj_b, BT, 4 * C, C);
  ops::accumulate(a.res_out.data(), a.res_mid.data(), BT * C);
}

void GPT::head_forward(Context& ctx, const float* x) {
  const int64_t BT = ctx.B * ctx.T, C = cfg_.n_embd;
  ops::layernorm_forward(ctx.lnf.data(), ctx.lnf_mean.data(), ctx.lnf_rstd.data(), x, lnf_w_,
                         lnf_b_, BT, C);
  // logits = lnf @ wte^T over the padded vocabulary (padding rows are zero and masked in the loss).
  ops::gemm(false, true, BT, cfg_.padded_vocab(), C, 1.0f, ctx.lnf.data(), C, wte_, C, 0.0f,
            ctx.logits.data(), cfg_.padded_vocab());
}

double GPT::forward(Context& ctx, float grad_scale) {
  TRELLIS_REQUIRE(ctx.T <= cfg_.block_size, "sequence length {} exceeds the context length {}",
                  ctx.T, cfg_.block_size);
  embedding_forward(ctx);
  const float* x = ctx.embedded.data();
  for (int l = 0; l < cfg_.n_layer; ++l) {
    block_forward(ctx, l, x);
    x = ctx.blocks[size_t(l)].res_out.data();
  }
  head_forward(ctx, x);
  for (int32_t t : ctx.targets)
    TRELLIS_REQUIRE(t >= 0 && t < cfg_.vocab_size, "target id {} is outside the vocabulary", t);
  return ops::cross_entropy(ctx.logits.data(), ctx.losses.data(), ctx.targets.data(),
                            ctx.B * ctx.T, cfg_.vocab_size, cfg_.padded_vocab(), grad_scale);
}

void GPT::block_backward(Context& ctx, int l, const float* x) {
  const int64_t BT = ctx.B * ctx.T, C = cfg_.n_embd;
  const BlockParams& p = blocks_[size_t(l)];
  const BlockGrads& g = dblocks_[size_t(l)];
  Context::BlockActs& a = ctx.blocks[size_t(l)];
  BackwardScratch& s = scratch_;
  // dres holds d(res_out) on entry and d(x) on exit: the residual path is the identity and each
  // LayerNorm backward adds its branch's contribution in place.
  zero(s.dgelu);
  ops::linear_backward(s.dgelu.data(), g.mlp_proj_w, g.mlp_proj_b, s.dres.data(), a.gelu.data(),
                       p.mlp_proj_w, BT, 4 * C, C);
  zero(s.dfc);
  ops::gelu_backward(s.dfc.data(), a.fc.data(), s.dgelu.data(), BT * 4 * C);
  zero(s.dln);
  ops::linear_backward(s.dln.data(), g.fc_w, g.fc_b, s.dfc.data(), a.ln2.data(), p.fc_w, BT, C,
                       4 * C);
  ops::layernorm_backward(s.dres.data(), g.ln2_w, g.ln2_b, s.dln.data(), a.res_mid.data(),
                          p.ln2_w, a.ln2_mean.data(), a.ln2_rstd.data(), BT, C);
  zero(s.datt);
  ops::linear_backward(s.datt.data(), g.proj_w, g.proj_b, s.dres.data(), a.att.data(), p.proj_w,
                       BT, C, C);
  zero(s.dqkv);
  ops::attention_backward(s.dqkv.data(), s.datt.data(), a.qkv.data(), a.probs.data(), ctx.B,
                          ctx.T, C, cfg_.n_head);
  zero(s.dln);
  ops::linear_backward(s.dln.data(), g.attn_w, g.attn_b, s.dqkv.data(), a.ln1.data(), p.attn_w,
                       BT, C, 3 * C);
  ops::layernorm_backward(s.dres.data(), g.ln1_w, g.ln1_b, s.dln.data(), x, p.ln1_w,
                          a.ln1_mean.data(), a.ln1_rstd.data(), BT, C);
}

void GPT::backward(Context& ctx, const std::function<void(int)>& on_block_done) {
  TRELLIS_CHECK(dwte_ != nullptr, "backward on a model without gradient buffers");
  const int64_t BT = ctx.B * ctx.T, C = cfg_.n_embd, Vp = cfg_.padded_vocab();
  scratch_.resize(cfg_, BT);
  BackwardScratch& s = scratch_;
  // Head: ctx.logits already hold dlogits (fused in the loss).
  zero(s.dln);
  ops::gemm(false, false, BT, C, Vp, 1.0f, ctx.logits.data(), Vp, wte_, C, 0.0f, s.dln.data(), C);
  ops::gemm(true, false, Vp, C, BT, 1.0f, ctx.logits.data(), Vp, ctx.lnf.data(), C, 1.0f, dwte_,
            C);
  zero(s.dres);
  const float* x_last =
      cfg_.n_layer > 0 ? ctx.blocks.back().res_out.data() : ctx.embedded.data();
  ops::layernorm_backward(s.dres.data(), dlnf_w_, dlnf_b_, s.dln.data(), x_last, lnf_w_,
                          ctx.lnf_mean.data(), ctx.lnf_rstd.data(), BT, C);
  for (int l = cfg_.n_layer - 1; l >= 0; --l) {
    const float* x = l == 0 ? ctx.embedded.data() : ctx.blocks[size_t(l - 1)].res_out.data();
    block_backward(ctx, l, x);
    if (on_block_done) on_block_done(l);
  }
  ops::embedding_backward(dwte_, dwpe_, s.dres.data(), ctx.tokens.data(), ctx.B, ctx.T, C);
  if (on_block_done) on_block_done(-1);
}

std::vector<float> GPT::last_logits(Context& ctx) {
  embedding_forward(ctx);
  const float* x = ctx.embedded.data();
  for (int l = 0; l < cfg_.n_layer; ++l) {
    block_forward(ctx, l, x);
    x = ctx.blocks[size_t(l)].res_out.data();
  }
  const int64_t C = cfg_.n_embd, V = cfg_.vocab_size;
  const int64_t last = ctx.T - 1;
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
