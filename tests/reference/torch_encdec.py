"""PyTorch reference encoder-decoder Transformer for checking trellis (torch ops only).

* `load_model(checkpoint_dir, dtype)`: (params, cfg) from a trellis checkpoint
  (model.safetensors + config.json); params are leaf tensors requiring grad.
* `encdec_loss(params, cfg, idx, targets)`: the loss trellis trains on for now: the source IS
  the window and the decoder input is the same window -> mean cross-entropy loss.
* `seq2seq_loss(params, cfg, src, tgt_in, targets)`: the general form (source and decoder
  input may differ, also in length); `encdec_loss(p, c, x, y) == seq2seq_loss(p, c, x, x, y)`.
* `seq2seq_logits(params, cfg, src, tgt_in, src_lengths)`: with `src_lengths` [B] the source
  keys at positions >= src_lengths[b] are masked in the encoder's self-attention and in every
  cross-attention (padding); the decoder's self-attention stays causal only.

Model (BART/mBART-style names, pre-LayerNorm everywhere, nn.Linear layout [out, in],
y = x @ W^T + b, biases on every linear; E = model.shared.weight is shared by the encoder
input, the decoder input and the output head):
  encoder (prefix model.encoder.):
    h = E[src] + embed_positions.weight[0..S-1]
    per layer i (prefix layers.{i}.):
      h = h + self_attn.out_proj(attn(q, k, v from LN(h; self_attn_layer_norm)))  not causal
      h = h + fc2(gelu_tanh(fc1(LN(h; final_layer_norm))))
    enc_out = LN(h; layer_norm)
  decoder (prefix model.decoder.):
    g = E[tgt_in] + embed_positions.weight[0..T-1]
    per layer j (prefix layers.{j}.):
      g = g + self_attn.out_proj(attn(q, k, v from LN(g; self_attn_layer_norm)))  causal
      g = g + encoder_attn.out_proj(attn(q from LN(g; encoder_attn_layer_norm),
                                         k, v from enc_out))                   not causal
      g = g + fc2(gelu_tanh(fc1(LN(g; final_layer_norm))))
    logits = LN(g; layer_norm) @ E^T   (tied; there is no lm_head tensor)
attn: H query heads of hd = C / H, Hkv = num_key_value_heads key/value heads (k_proj and
v_proj are [Hkv * hd, C]); query head j uses kv head j // (H / Hkv) (HF repeat_kv), for self
and cross attention alike; softmax(q k^T / sqrt(hd)) v. LayerNorm eps = layer_norm_eps (1e-5),
gelu_tanh = HF gelu_new, no embedding scaling, no dropout. Every k_proj.bias has an exactly
zero gradient (a shift q . b_k shared by all keys of a softmax row).
"""

import json
import math
import os

import torch

from reference import dropout_masks as drop  # identity unless a test sets drop.ACTIVE
from reference.torch_ref import (gelu_tanh, key_padding_mask, layer_norm, linear, lm_loss,
                                 load_params, random_params)


class EncDecConfig:
    def __init__(self, c):
        arch = c.get("architectures")
        if arch is not None and arch != ["TrellisEncoderDecoder"]:
            raise ValueError(f"architectures {arch}, expected ['TrellisEncoderDecoder']")
        if c.get("model_type", "trellis-encoder-decoder") != "trellis-encoder-decoder":
            raise ValueError(f"model_type {c.get('model_type')!r}, "
                             f"expected 'trellis-encoder-decoder'")
        self.n_embd = int(c["d_model"])
        self.n_enc_layer = int(c["encoder_layers"])
        self.n_dec_layer = int(c["decoder_layers"])
        self.n_head = int(c["encoder_attention_heads"])
        if int(c.get("decoder_attention_heads", self.n_head)) != self.n_head:
            raise ValueError(f"decoder_attention_heads {c['decoder_attention_heads']} != "
                             f"encoder_attention_heads {self.n_head}")
        self.n_kv_head = int(c.get("num_key_value_heads", self.n_head))
        self.ffn_hidden = int(c["encoder_ffn_dim"])
        if int(c.get("decoder_ffn_dim", self.ffn_hidden)) != self.ffn_hidden:
            raise ValueError(f"decoder_ffn_dim {c['decoder_ffn_dim']} != encoder_ffn_dim "
                             f"{self.ffn_hidden}")
        self.block_size = int(c["max_position_embeddings"])
        self.vocab_size = int(c["vocab_size"])
        self.eps = float(c.get("layer_norm_eps", 1e-5))
        if not c.get("tie_word_embeddings", True):
            raise ValueError("tie_word_embeddings false: this reference ties the output head")
        if c.get("activation_function", "gelu_new") != "gelu_new":
            raise ValueError(f"activation_function {c.get('activation_function')!r}, "
                             f"expected 'gelu_new'")
        if c.get("scale_embedding", False):
            raise ValueError("scale_embedding true: this reference does not scale embeddings")
        if self.n_embd % self.n_head or self.n_head % self.n_kv_head:
            raise ValueError(f"d_model {self.n_embd}, heads {self.n_head}, kv heads "
                             f"{self.n_kv_head}: not divisible")
        self.head_dim = self.n_embd // self.n_head

    @classmethod
    def from_json(cls, path):
        with open(path) as f:
            return cls(json.load(f))

    def __repr__(self):
        return (f"EncDecConfig(n_enc_layer={self.n_enc_layer}, n_dec_layer={self.n_dec_layer}, "
                f"n_head={self.n_head}, n_kv_head={self.n_kv_head}, n_embd={self.n_embd}, "
                f"ffn_hidden={self.ffn_hidden}, block_size={self.block_size}, "
                f"vocab_size={self.vocab_size}, eps={self.eps})")


def _attn_shapes(s, p, cfg):
    C, hd = cfg.n_embd, cfg.head_dim
    Q, KV = cfg.n_head * hd, cfg.n_kv_head * hd
    s[p + "q_proj.weight"], s[p + "q_proj.bias"] = (Q, C), (Q,)
    s[p + "k_proj.weight"], s[p + "k_proj.bias"] = (KV, C), (KV,)
    s[p + "v_proj.weight"], s[p + "v_proj.bias"] = (KV, C), (KV,)
    s[p + "out_proj.weight"], s[p + "out_proj.bias"] = (C, Q), (C,)


def param_shapes(cfg):
    """Expected {name: shape}."""
    C, V, F_ = cfg.n_embd, cfg.vocab_size, cfg.ffn_hidden
    s = {"model.shared.weight": (V, C)}
    for side, n_layer in (("encoder", cfg.n_enc_layer), ("decoder", cfg.n_dec_layer)):
        s[f"model.{side}.embed_positions.weight"] = (cfg.block_size, C)
        for i in range(n_layer):
            p = f"model.{side}.layers.{i}."
            norms = ["self_attn_layer_norm", "final_layer_norm"]
            _attn_shapes(s, p + "self_attn.", cfg)
            if side == "decoder":
                norms.append("encoder_attn_layer_norm")
                _attn_shapes(s, p + "encoder_attn.", cfg)
            for n in norms:
                s[p + n + ".weight"], s[p + n + ".bias"] = (C,), (C,)
            s[p + "fc1.weight"], s[p + "fc1.bias"] = (F_, C), (F_,)
            s[p + "fc2.weight"], s[p + "fc2.bias"] = (C, F_), (C,)
        s[f"model.{side}.layer_norm.weight"] = (C,)
        s[f"model.{side}.layer_norm.bias"] = (C,)
    return s


def load_model(checkpoint_dir, dtype=torch.float32, requires_grad=True):
    """(params, cfg) from a trellis encoder-decoder checkpoint directory."""
    cfg = EncDecConfig.from_json(os.path.join(checkpoint_dir, "config.json"))
    return load_params(checkpoint_dir, param_shapes(cfg), dtype, requires_grad), cfg


def random_model(cfg, seed=0, dtype=torch.float32):
    """Random parameters (N(0, 0.02) weights and biases, LN around 1/0) for self-checks."""
    return random_params(param_shapes(cfg), seed, dtype)


# ---------------------------------------------------------------------------
# forward
# ---------------------------------------------------------------------------


def _mlp(x, params, p, eps):
    n = layer_norm(x, params, p + "final_layer_norm", eps)
    return linear(gelu_tanh(linear(n, params, p + "fc1")), params, p + "fc2")


def attention(params, prefix, cfg, xq, xkv, causal, key_lengths=None, layer=0,
              site=drop.ATTN_PROBS):
    """out_proj(softmax(q k^T / sqrt(hd)) v): q from xq [B,Tq,C], k and v from xkv [B,Tk,C];
    key_lengths [B]: keys at positions >= key_lengths[b] masked."""
    B, Tq, _ = xq.shape
    Tk = xkv.shape[1]
    H, Hkv, hd = cfg.n_head, cfg.n_kv_head, cfg.head_dim
    q = linear(xq, params, prefix + "q_proj").view(B, Tq, H, hd).transpose(1, 2)
    k = linear(xkv, params, prefix + "k_proj").view(B, Tk, Hkv, hd).transpose(1, 2)
    v = linear(xkv, params, prefix + "v_proj").view(B, Tk, Hkv, hd).transpose(1, 2)
    kv_of = torch.arange(H) // (H // Hkv)  # kv head of each query head
    k, v = k[:, kv_of], v[:, kv_of]  # [B, H, Tk, hd]
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
    if causal:
        mask = torch.ones(Tq, Tk, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf"))
    if key_lengths is not None:
        att = att.masked_fill(~key_padding_mask(key_lengths, Tk), float("-inf"))
    att = drop.attn(torch.softmax(att, dim=-1), layer, site)
    y = (att @ v).transpose(1, 2).reshape(B, Tq, H * hd)
    # the branch's dropout site follows the probabilities' (ATTN_OUT / CROSS_OUT)
    return drop.resid(linear(y, params, prefix + "out_proj"), layer, site + 1)


def encode(params, cfg, src, lengths=None):
    """src [B,S] int64 -> enc_out [B,S,C] (after the encoder's final LayerNorm); lengths [B]:
    source keys >= lengths[b] masked."""
    S = src.shape[1]
    if S > cfg.block_size:
        raise ValueError(f"source length {S} exceeds max_position_embeddings {cfg.block_size}")
    h = params["model.shared.weight"][src] + params["model.encoder.embed_positions.weight"][:S]
    h = drop.resid(h, 0, drop.EMBED)
    for i in range(cfg.n_enc_layer):
        p = f"model.encoder.layers.{i}."
        n = layer_norm(h, params, p + "self_attn_layer_norm", cfg.eps)
        h = h + attention(params, p + "self_attn.", cfg, n, n, causal=False,
                          key_lengths=lengths, layer=i)
        h = h + drop.resid(_mlp(h, params, p, cfg.eps), i, drop.MLP_OUT)
    return layer_norm(h, params, "model.encoder.layer_norm", cfg.eps)


def decode(params, cfg, tgt_in, enc_out, src_lengths=None):
    """tgt_in [B,T] int64, enc_out [B,S,C] -> logits [B,T,V]; src_lengths [B]: encoder
    positions >= src_lengths[b] masked in cross-attention."""
    T = tgt_in.shape[1]
    if T > cfg.block_size:
        raise ValueError(f"target length {T} exceeds max_position_embeddings {cfg.block_size}")
    E = params["model.shared.weight"]
    g = drop.resid(E[tgt_in] + params["model.decoder.embed_positions.weight"][:T], 0,
                   drop.DEC_EMBED)
    for j in range(cfg.n_dec_layer):
        p = f"model.decoder.layers.{j}."
        layer = cfg.n_enc_layer + j  # the global block index
        n = layer_norm(g, params, p + "self_attn_layer_norm", cfg.eps)
        g = g + attention(params, p + "self_attn.", cfg, n, n, causal=True, layer=layer)
        n = layer_norm(g, params, p + "encoder_attn_layer_norm", cfg.eps)
        g = g + attention(params, p + "encoder_attn.", cfg, n, enc_out, causal=False,
                          key_lengths=src_lengths, layer=layer, site=drop.CROSS_PROBS)
        g = g + drop.resid(_mlp(g, params, p, cfg.eps), layer, drop.MLP_OUT)
    return layer_norm(g, params, "model.decoder.layer_norm", cfg.eps) @ E.t()


def seq2seq_logits(params, cfg, src, tgt_in, src_lengths=None):
    return decode(params, cfg, tgt_in, encode(params, cfg, src, src_lengths), src_lengths)


def encdec_logits(params, cfg, idx):
    """idx [B,T] int64 is both the source and the decoder input -> logits [B,T,V]."""
    return seq2seq_logits(params, cfg, idx, idx)


def seq2seq_loss(params, cfg, src, tgt_in, targets, label_smoothing=0.0):
    """Mean cross-entropy over all B*T targets (label-smoothed by PyTorch's own definition)."""
    return lm_loss(seq2seq_logits(params, cfg, src, tgt_in), targets, label_smoothing)


def encdec_loss(params, cfg, idx, targets, label_smoothing=0.0):
    """Mean cross-entropy over all B*T targets, the window as source and decoder input."""
    return seq2seq_loss(params, cfg, idx, idx, targets, label_smoothing)
