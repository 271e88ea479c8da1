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
  encdec  1. a 2+2-layer model equals torch.nn.Transformer (norm_first, tanh GELU, no
             dropout, causal tgt_mask, its encoder/decoder final norms) loaded with the same
             weights, with the output head E^T applied to its output; source and decoder
             input of different lengths.
          2. GQA: 4 heads over 2 kv heads equals the 4-kv-head model whose k/v projections
             (weights and biases) repeat kv head j // (H / Hkv), self and cross attention.
          3. the decoder is causal in its own input (logits at t unchanged when decoder
             tokens after t change) and sees the whole source (logits at 0 change when the
             last source token changes); encdec_loss == seq2seq_loss with source = input.
          4. every k_proj.bias (encoder self, decoder self, decoder cross) has an exactly
             zero gradient (float64 rounding only; float32 within the oracle's 1e-5).
          5. gradcheck in float64 over every parameter, MHA and GQA.

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

from reference import torch_encdec, torch_encoder, torch_llama  # noqa: E402

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


# ---------------------------------------------------------------------------
# encoder-decoder
# ---------------------------------------------------------------------------


def encdec_cfg(V=11, C=16, H=2, n_kv_head=None, F_=64, L_enc=2, L_dec=2, block=8):
    return torch_encdec.EncDecConfig({
        "architectures": ["TrellisEncoderDecoder"], "model_type": "trellis-encoder-decoder",
        "d_model": C, "encoder_layers": L_enc, "decoder_layers": L_dec,
        "encoder_attention_heads": H, "decoder_attention_heads": H,
        "num_key_value_heads": n_kv_head or H, "encoder_ffn_dim": F_, "decoder_ffn_dim": F_,
        "max_position_embeddings": block, "vocab_size": V, "layer_norm_eps": 1e-5,
        "tie_word_embeddings": True, "activation_function": "gelu_new",
        "scale_embedding": False})


def _load_mha(mha, params, p):
    """torch.nn.MultiheadAttention <- {q,k,v,out}_proj under prefix p."""
    mha.in_proj_weight.copy_(torch.cat([params[p + f"{x}_proj.weight"] for x in "qkv"]))
    mha.in_proj_bias.copy_(torch.cat([params[p + f"{x}_proj.bias"] for x in "qkv"]))
    mha.out_proj.weight.copy_(params[p + "out_proj.weight"])
    mha.out_proj.bias.copy_(params[p + "out_proj.bias"])


def _load_ln(ln, params, p):
    ln.weight.copy_(params[p + ".weight"])
    ln.bias.copy_(params[p + ".bias"])


def _load_ffn(layer, params, p):
    layer.linear1.weight.copy_(params[p + "fc1.weight"])
    layer.linear1.bias.copy_(params[p + "fc1.bias"])
    layer.linear2.weight.copy_(params[p + "fc2.weight"])
    layer.linear2.bias.copy_(params[p + "fc2.bias"])


def torch_nn_transformer(params, cfg):
    """torch.nn.Transformer (pre-LN, tanh GELU, no dropout) holding the same weights."""
    m = torch.nn.Transformer(
        d_model=cfg.n_embd, nhead=cfg.n_head, num_encoder_layers=cfg.n_enc_layer,
        num_decoder_layers=cfg.n_dec_layer, dim_feedforward=cfg.ffn_hidden, dropout=0.0,
        activation=lambda t: F.gelu(t, approximate="tanh"), layer_norm_eps=cfg.eps,
        batch_first=True, norm_first=True).to(torch.float64)
    with torch.no_grad():
        for i, layer in enumerate(m.encoder.layers):
            p = f"model.encoder.layers.{i}."
            _load_mha(layer.self_attn, params, p + "self_attn.")
            _load_ln(layer.norm1, params, p + "self_attn_layer_norm")
            _load_ln(layer.norm2, params, p + "final_layer_norm")
            _load_ffn(layer, params, p)
        _load_ln(m.encoder.norm, params, "model.encoder.layer_norm")
        for j, layer in enumerate(m.decoder.layers):
            p = f"model.decoder.layers.{j}."
            _load_mha(layer.self_attn, params, p + "self_attn.")
            _load_mha(layer.multihead_attn, params, p + "encoder_attn.")
            _load_ln(layer.norm1, params, p + "self_attn_layer_norm")
            _load_ln(layer.norm2, params, p + "encoder_attn_layer_norm")
            _load_ln(layer.norm3, params, p + "final_layer_norm")
            _load_ffn(layer, params, p)
        _load_ln(m.decoder.norm, params, "model.decoder.layer_norm")
    return m.eval()


def check_encdec():
    dt = torch.float64
    cfg = encdec_cfg()
    params = scaled(torch_encdec.random_model(cfg, seed=5, dtype=dt), 10.0)
    g = torch.Generator().manual_seed(9)
    src = torch.randint(cfg.vocab_size, (2, 7), generator=g)
    tgt = torch.randint(cfg.vocab_size, (2, 5), generator=g)
    E = params["model.shared.weight"]

    # 1. torch.nn.Transformer
    m = torch_nn_transformer(params, cfg)
    with torch.no_grad():
        S, T = src.shape[1], tgt.shape[1]
        out = m(E[src] + params["model.encoder.embed_positions.weight"][:S],
                E[tgt] + params["model.decoder.embed_positions.weight"][:T],
                tgt_mask=torch.ones(T, T, dtype=torch.bool).triu(1))
        want = out @ E.t()
        got = torch_encdec.seq2seq_logits(params, cfg, src, tgt)
    check(rel(got, want) < 1e-13, f"encdec: == torch.nn.Transformer(norm_first, tanh GELU), "
          f"source 7 / target 5 tokens ({rel(got, want):.1e})")

    # 2. GQA == MHA with repeated kv heads
    gcfg = encdec_cfg(C=16, H=4, n_kv_head=2, F_=24)
    hd, n_rep = gcfg.head_dim, gcfg.n_head // gcfg.n_kv_head
    gp = scaled(torch_encdec.random_model(gcfg, seed=6, dtype=dt), 10.0)
    mha = {}
    for n, p in gp.items():
        p = p.detach()
        if n.endswith(("k_proj.weight", "v_proj.weight", "k_proj.bias", "v_proj.bias")):
            p = p.view(gcfg.n_kv_head, 1, hd, -1).expand(-1, n_rep, -1, -1)
            p = p.reshape(gcfg.n_head * hd, -1).squeeze(-1) if n.endswith("bias") else \
                p.reshape(gcfg.n_head * hd, -1)
        mha[n] = p
    lg = torch_encdec.seq2seq_logits(gp, gcfg, src, tgt)
    e = rel(lg, torch_encdec.seq2seq_logits(mha, encdec_cfg(C=16, H=4, F_=24), src, tgt))
    check(e < 1e-13, f"encdec: GQA == MHA with kv head j // (H/Hkv) repeated, self and cross "
          f"({e:.1e})")
    check(rel(lg, torch_encdec.seq2seq_logits(
        {n: (p.detach() * 1.01 if "encoder_attn.k_proj.weight" in n else p) for n, p in
         gp.items()}, gcfg, src, tgt)) > 1e-4, "encdec: cross-attention keys reach the logits")

    # 3. causal decoder, bidirectional source, window form
    lg = torch_encdec.seq2seq_logits(params, cfg, src, tgt)
    t2 = tgt.clone()
    t2[:, 3:] = (t2[:, 3:] + 1) % cfg.vocab_size
    lg2 = torch_encdec.seq2seq_logits(params, cfg, src, t2)
    check(rel(lg2[:, :3], lg[:, :3]) < 1e-14 and rel(lg2[:, 3:], lg[:, 3:]) > 1e-3,
          "encdec: decoder causal in its input (positions < 3 unchanged, later ones changed)")
    s2 = src.clone()
    s2[:, -1] = (s2[:, -1] + 1) % cfg.vocab_size
    check(rel(torch_encdec.seq2seq_logits(params, cfg, s2, tgt)[:, 0], lg[:, 0]) > 1e-4,
          "encdec: decoder position 0 sees the last source token")
    xb, yb = batch(cfg)
    check(torch.equal(torch_encdec.encdec_loss(params, cfg, xb, yb),
                      torch_encdec.seq2seq_loss(params, cfg, xb, xb, yb)),
          "encdec: encdec_loss(x, y) == seq2seq_loss(x, x, y)")

    # 4. zero key-bias gradients
    kb = [n for n in params if n.endswith("k_proj.bias")]
    check(len(kb) == cfg.n_enc_layer + 2 * cfg.n_dec_layer, f"encdec: {len(kb)} key biases")
    torch_encdec.encdec_loss(params, cfg, xb, yb).backward()
    r64 = max(float(params[n].grad.norm() / params[n[:-len("k_proj.bias")] + "q_proj.bias"]
                    .grad.norm()) for n in kb)
    check(r64 < 1e-12, f"encdec: every k_proj.bias gradient is zero ({r64:.1e} of the "
          f"q_proj.bias's, float64)")
    p32 = {n: t.detach().float().requires_grad_(True) for n, t in params.items()}
    torch_encdec.encdec_loss(p32, cfg, xb, yb).backward()
    r32 = max(float(p32[n].grad.norm() / p32[n[:-len("k_proj.bias")] + "q_proj.bias"]
                    .grad.norm()) for n in kb)
    check(r32 < 1e-5, f"encdec: float32 k_proj.bias gradients are rounding noise ({r32:.1e} "
          f"of the q_proj.bias's, the oracle allows 1e-5)")
    e = rel(torch_encdec.encdec_logits(p32, cfg, xb), torch_encdec.encdec_logits(params, cfg, xb))
    check(e < 1e-5, f"encdec: float32 forward within 1e-5 of float64 ({e:.1e})")

    # 5. gradcheck
    small = encdec_cfg(C=8, H=2, F_=16, block=5)
    sp = scaled(torch_encdec.random_model(small, seed=7, dtype=dt), 10.0)
    check(gradcheck(torch_encdec.encdec_loss, sp, small, *batch(small, T=5)),
          "encdec: gradcheck (float64, every parameter)")
    small = encdec_cfg(C=8, H=4, n_kv_head=2, F_=12, block=5)  # head size 2
    sp = scaled(torch_encdec.random_model(small, seed=8, dtype=dt), 10.0)
    sx, _ = batch(small, T=5, seed=3)
    tx, ty = batch(small, T=4, seed=4)

    def s2s(ps, c, x, y):
        return torch_encdec.seq2seq_loss(ps, c, sx, x, y)

    check(gradcheck(s2s, sp, small, tx, ty),
          "encdec: gradcheck (float64, every parameter, GQA, source 5 / target 4 tokens)")


def main():
    torch.set_num_threads(1)
    check_llama()
    check_encoder()
    check_encdec()
    print(f"reference self-checks: {'all passed' if not failures else f'{len(failures)} failed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
