#!/usr/bin/env python3
"""Self-checks of the PyTorch reference models (no trellis binary needed; run by ctest).

The oracle (test_torch_oracle.py) is only as good as its references, so each is checked
here against a second, independently written formulation:

  llama   1. rope() equals HF's apply_rotary_pos_emb written out (emb = cat(freqs, freqs),
             x * cos + rotate_half(x) * sin), and scores of rotated q, k depend only on the
             position difference.
          2. GQA: a model with 4 heads over 2 kv heads equals the 4-kv-head model whose k/v
             projections repeat each kv head for its query heads (HF repeat_kv: query
             head j uses kv head j // (H / Hkv)).
          3. causal: logits at t do not change when tokens after t change.
          4. the whole forward equals a second implementation built from HF-style pieces
             (rotate_half RoPE, repeat_kv by expand/reshape, RMSNorm through torch.norm).
          5. gradcheck in float64 over every parameter.
  encoder 1. one layer equals torch.nn.TransformerEncoderLayer (norm_first, tanh GELU,
             no dropout) loaded with the same weights.
          2. bidirectional: logits at position 0 change when the last token changes.
          3. k_proj.bias has an exactly zero gradient (float64 rounding only).
          4. gradcheck in float64 over every parameter.

Exit status 0 when all pass, 1 otherwise.
"""

import math
import os
import sys

if os.environ.get("TRELLIS_SOURCE"):
    sys.path.insert(0, os.path.join(os.environ["TRELLIS_SOURCE"], "tests"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from reference import torch_encoder, torch_llama  # noqa: E402

failures = []


def check(cond, msg):
    print(("ok: " if cond else "FAIL: ") + msg, flush=True)
    if not cond:
        failures.append(msg)


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm())


def llama_cfg(n_kv_head=2, V=11, C=16, H=4, F_=24, L=2, block=8):
    return torch_llama.LlamaConfig({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": C,
        "intermediate_size": F_, "num_attention_heads": H, "num_key_value_heads": n_kv_head,
        "num_hidden_layers": L, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "max_position_embeddings": block, "vocab_size": V, "tie_word_embeddings": False,
        "hidden_act": "silu"})


def encoder_cfg(V=11, C=16, H=2, F_=64, L=2, block=8):
    return torch_encoder.EncoderConfig({
        "architectures": ["TrellisEncoder"], "model_type": "trellis-encoder", "hidden_size": C,
        "intermediate_size": F_, "num_attention_heads": H, "num_hidden_layers": L,
        "max_position_embeddings": block, "vocab_size": V, "layer_norm_eps": 1e-5,
        "tie_word_embeddings": True, "hidden_act": "gelu_new"})


def batch(cfg, B=2, T=None, seed=1):
    g = torch.Generator().manual_seed(seed)
    T = T or cfg.block_size
    x = torch.randint(cfg.vocab_size, (B, T), generator=g)
    y = torch.randint(cfg.vocab_size, (B, T), generator=g)
    return x, y


def scaled(params, s):
    """Larger random weights than the 0.02 init, so that attention is far from uniform."""
    return {n: (p.detach() * (1.0 if "norm" in n else s)).requires_grad_(True)
            for n, p in params.items()}


def gradcheck(loss_fn, params, cfg, x, y):
    names = list(params)

    def f(*ts):
        return loss_fn(dict(zip(names, ts)), cfg, x, y)

    return torch.autograd.gradcheck(f, tuple(params[n] for n in names), eps=1e-6, atol=1e-8,
                                    rtol=1e-6, raise_exception=False)


# ---------------------------------------------------------------------------
# llama
# ---------------------------------------------------------------------------


def hf_rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def hf_rope(x, theta):
    T, hd = x.shape[-2], x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return x * emb.cos().to(x.dtype) + hf_rotate_half(x) * emb.sin().to(x.dtype)


def hf_style_llama_logits(params, cfg, idx):
    """A second llama forward written from HF's pieces, independent of torch_llama's code."""
    B, T = idx.shape
    H, Hkv, hd = cfg.n_head, cfg.n_kv_head, cfg.head_dim
    n_rep = H // Hkv

    def norm(x, w):
        rms = torch.norm(x, dim=-1, keepdim=True) / math.sqrt(x.shape[-1])
        return w * (x / torch.sqrt(rms * rms + cfg.eps))

    def repeat_kv(t):  # [B, Hkv, T, hd] -> [B, H, T, hd]
        return t[:, :, None].expand(B, Hkv, n_rep, T, hd).reshape(B, H, T, hd)

    h = F.embedding(idx, params["model.embed_tokens.weight"])
    bias = torch.full((T, T), float("-inf"), dtype=h.dtype).triu(1)
    for i in range(cfg.n_layer):
        p = f"model.layers.{i}."
        n = norm(h, params[p + "input_layernorm.weight"])
        q = F.linear(n, params[p + "self_attn.q_proj.weight"]).view(B, T, H, hd).permute(0, 2, 1, 3)
        k = F.linear(n, params[p + "self_attn.k_proj.weight"]).view(B, T, Hkv, hd).permute(0, 2, 1, 3)
        v = F.linear(n, params[p + "self_attn.v_proj.weight"]).view(B, T, Hkv, hd).permute(0, 2, 1, 3)
        q, k = hf_rope(q, cfg.theta), hf_rope(k, cfg.theta)
        k, v = repeat_kv(k), repeat_kv(v)
        w = torch.einsum("bhsd,bhtd->bhst", q, k) / math.sqrt(hd) + bias
        o = torch.einsum("bhst,bhtd->bshd", F.softmax(w, dim=-1), v).reshape(B, T, H * hd)
        h = h + F.linear(o, params[p + "self_attn.o_proj.weight"])
        n = norm(h, params[p + "post_attention_layernorm.weight"])
        a = F.linear(n, params[p + "mlp.gate_proj.weight"])
        h = h + F.linear(a * torch.sigmoid(a) * F.linear(n, params[p + "mlp.up_proj.weight"]),
                         params[p + "mlp.down_proj.weight"])
    return F.linear(norm(h, params["model.norm.weight"]), params["lm_head.weight"])


def check_llama():
    dt = torch.float64
    cfg = llama_cfg()
    hd = cfg.head_dim
    g = torch.Generator().manual_seed(7)

    # 1. RoPE convention
    x = torch.randn(3, 4, 64, hd, generator=g, dtype=dt)
    check(rel(torch_llama.rope(x, 10000.0), hf_rope(x, 10000.0)) < 1e-13,
          "llama: rope == HF apply_rotary_pos_emb (float64)")
    check(rel(torch_llama.rope(x.float(), 10000.0), hf_rope(x, 10000.0)) < 1e-6,
          "llama: rope in float32 within 1e-6 of float64")
    q, k = torch.randn(hd, generator=g, dtype=dt), torch.randn(hd, generator=g, dtype=dt)
    qs = torch_llama.rope(q.expand(64, hd), 10000.0)
    ks = torch_llama.rope(k.expand(64, hd), 10000.0)
    s = qs @ ks.t()  # s[m, n] must depend on m - n only
    diag_spread = max(float((s.diagonal(d) - s.diagonal(d)[0]).abs().max()) for d in range(-63, 64))
    check(diag_spread < 1e-12, f"llama: rotated scores depend on position difference only "
          f"({diag_spread:.1e})")

    # 2. GQA == MHA with repeated kv heads
    params = scaled(torch_llama.random_model(cfg, seed=1, dtype=dt), 10.0)
    xb, yb = batch(cfg)
    n_rep = cfg.n_head // cfg.n_kv_head
    mha_cfg = llama_cfg(n_kv_head=cfg.n_head)
    mha = {}
    for n, p in params.items():
        if n.endswith("k_proj.weight") or n.endswith("v_proj.weight"):
            p = p.detach().view(cfg.n_kv_head, 1, hd, -1).expand(-1, n_rep, -1, -1)
            p = p.reshape(cfg.n_head * hd, -1)
        mha[n] = p.detach()
    lg = torch_llama.llama_logits(params, cfg, xb)
    check(rel(lg, torch_llama.llama_logits(mha, mha_cfg, xb)) < 1e-13,
          "llama: GQA == MHA with kv head j // (H/Hkv) repeated")

    # 3. causal
    x2 = xb.clone()
    x2[:, 5:] = (x2[:, 5:] + 1) % cfg.vocab_size
    lg2 = torch_llama.llama_logits(params, cfg, x2)
    check(rel(lg2[:, :5], lg[:, :5]) < 1e-14 and rel(lg2[:, 5:], lg[:, 5:]) > 1e-3,
          "llama: causal (positions < 5 unchanged, later ones changed)")

    # 4. second implementation
    check(rel(lg, hf_style_llama_logits(params, cfg, xb)) < 1e-13,
          "llama: forward == HF-style second implementation (float64)")
    p32 = {n: p.detach().float() for n, p in params.items()}
    e = rel(torch_llama.llama_logits(p32, cfg, xb), lg)
    check(e < 1e-5, f"llama: float32 forward within 1e-5 of float64 ({e:.1e})")

    # 5. gradcheck
    small = llama_cfg(C=8, H=4, F_=12, block=5)  # head size 2, 4 heads over 2 kv heads
    sp = scaled(torch_llama.random_model(small, seed=2, dtype=dt), 10.0)
    check(gradcheck(torch_llama.llama_loss, sp, small, *batch(small, T=5)),
          "llama: gradcheck (float64, every parameter)")


# ---------------------------------------------------------------------------
# encoder
# ---------------------------------------------------------------------------


def check_encoder():
    dt = torch.float64
    cfg = encoder_cfg()
    C = cfg.n_embd
    params = scaled(torch_encoder.random_model(cfg, seed=3, dtype=dt), 10.0)
    xb, yb = batch(cfg)

    # 1. one layer vs torch.nn.TransformerEncoderLayer
    layer = torch.nn.TransformerEncoderLayer(
        C, cfg.n_head, dim_feedforward=cfg.ffn_hidden, dropout=0.0,
        activation=lambda t: F.gelu(t, approximate="tanh"), layer_norm_eps=cfg.eps,
        batch_first=True, norm_first=True).to(dt)
    p = "layers.0."
    sa = p + "self_attn."
    with torch.no_grad():
        layer.self_attn.in_proj_weight.copy_(torch.cat(
            [params[sa + f"{x}_proj.weight"] for x in "qkv"]))
        layer.self_attn.in_proj_bias.copy_(torch.cat(
            [params[sa + f"{x}_proj.bias"] for x in "qkv"]))
        layer.self_attn.out_proj.weight.copy_(params[sa + "out_proj.weight"])
        layer.self_attn.out_proj.bias.copy_(params[sa + "out_proj.bias"])
        layer.linear1.weight.copy_(params[p + "fc1.weight"])
        layer.linear1.bias.copy_(params[p + "fc1.bias"])
        layer.linear2.weight.copy_(params[p + "fc2.weight"])
        layer.linear2.bias.copy_(params[p + "fc2.bias"])
        layer.norm1.weight.copy_(params[p + "self_attn_layer_norm.weight"])
        layer.norm1.bias.copy_(params[p + "self_attn_layer_norm.bias"])
        layer.norm2.weight.copy_(params[p + "final_layer_norm.weight"])
        layer.norm2.bias.copy_(params[p + "final_layer_norm.bias"])
        # a one-layer encoder with a plain final LayerNorm: logits = LN(layer(h0)) @ E^T
        one = encoder_cfg(L=1)
        one_params = {n: t for n, t in params.items() if not n.startswith("layers.1.")}
        one_params["layer_norm.weight"] = torch.ones(C, dtype=dt)
        one_params["layer_norm.bias"] = torch.zeros(C, dtype=dt)
        got = torch_encoder.encoder_logits(one_params, one, xb)
        h0 = params["embed_tokens.weight"][xb] + params["embed_positions.weight"][:xb.shape[1]]
        want_logits = F.layer_norm(layer(h0), (C,), eps=cfg.eps) @ params["embed_tokens.weight"].t()
    check(rel(got, want_logits) < 1e-13,
          "encoder: one layer == torch.nn.TransformerEncoderLayer(norm_first, tanh GELU)")

    # 2. bidirectional
    lg = torch_encoder.encoder_logits(params, cfg, xb)
    x2 = xb.clone()
    x2[:, -1] = (x2[:, -1] + 1) % cfg.vocab_size
    check(rel(torch_encoder.encoder_logits(params, cfg, x2)[:, 0], lg[:, 0]) > 1e-4,
          "encoder: bidirectional (position 0 sees the last token)")

    # 3. zero key-bias gradient
    loss = torch_encoder.encoder_loss(params, cfg, xb, yb)
    loss.backward()
    for i in range(cfg.n_layer):
        gk = params[f"layers.{i}.self_attn.k_proj.bias"].grad.norm()
        gq = params[f"layers.{i}.self_attn.q_proj.bias"].grad.norm()
        check(float(gk / gq) < 1e-12, f"encoder: layer {i} k_proj.bias gradient is zero "
              f"({float(gk / gq):.1e} of q_proj.bias's)")
    p32 = {n: t.detach().float().requires_grad_(True) for n, t in params.items()}
    torch_encoder.encoder_loss(p32, cfg, xb, yb).backward()
    r32 = max(float(p32[f"layers.{i}.self_attn.k_proj.bias"].grad.norm()
                    / p32[f"layers.{i}.self_attn.q_proj.bias"].grad.norm())
              for i in range(cfg.n_layer))
    check(r32 < 1e-5, f"encoder: float32 k_proj.bias gradient is rounding noise ({r32:.1e} of "
          f"q_proj.bias's, the oracle allows 1e-5)")

    # 4. gradcheck
    small = encoder_cfg(C=8, H=2, F_=16, block=5)
    sp = scaled(torch_encoder.random_model(small, seed=4, dtype=dt), 10.0)
    check(gradcheck(torch_encoder.encoder_loss, sp, small, *batch(small, T=5)),
          "encoder: gradcheck (float64, every parameter)")


def main():
    torch.set_num_threads(1)
    check_llama()
    check_encoder()
    print(f"reference self-checks: {'all passed' if not failures else f'{len(failures)} failed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
