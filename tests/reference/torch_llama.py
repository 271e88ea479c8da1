"""PyTorch reference LLaMA-style decoder for checking trellis (written from torch ops).

* `load_model(checkpoint_dir, dtype)`: (params, cfg) from a trellis checkpoint
  (model.safetensors + config.json, HF LlamaConfig keys); params are leaf tensors
  requiring grad.
* `llama_loss(params, cfg, idx, targets)`: forward pass -> mean cross-entropy loss.
* `llama_hidden(params, cfg, idx, lengths)`: the final RMSNorm's output [B,T,C]; with `lengths`
  [B] the keys at positions >= lengths[b] are masked as well (padding).
* `rope(x, theta)`: rotary position embedding of [..., T, hd] at positions 0..T-1.

Model (HF LlamaForCausalLM names, nn.Linear layout [out, in], y = x @ W^T, no biases):
  h = model.embed_tokens.weight[idx]
  per layer i (prefix model.layers.{i}.):
    n = rmsnorm(h) * input_layernorm.weight
    q = rope(n @ self_attn.q_proj^T)  as H heads of hd = C / H
    k = rope(n @ self_attn.k_proj^T)  as Hkv heads; v = n @ self_attn.v_proj^T as Hkv heads
    query head j attends with kv head j // (H / Hkv) (grouped-query attention, HF repeat_kv)
    h = h + self_attn.o_proj(causal softmax(q k^T / sqrt(hd)) v)
    n = rmsnorm(h) * post_attention_layernorm.weight
    h = h + mlp.down_proj(silu(mlp.gate_proj(n)) * mlp.up_proj(n))
  logits = (rmsnorm(h) * model.norm.weight) @ lm_head.weight^T   (untied)
rmsnorm(x) = x * rsqrt(mean(x^2, last dim) + rms_norm_eps), in the working dtype.
RoPE is HF's rotate_half convention: dimension d < hd/2 is paired with d + hd/2 and the pair
is rotated by the angle pos * theta^(-2d/hd). No dropout.
"""

import json
import math
import os

import torch
import torch.nn.functional as F

from reference import dropout_masks as drop  # identity unless a test sets drop.ACTIVE
from reference.torch_ref import key_padding_mask, lm_loss, load_params, random_params


class LlamaConfig:
    def __init__(self, c):
        arch = c.get("architectures")
        # (a classifier's checkpoint says LlamaForSequenceClassification)
        if arch is not None and arch not in (["LlamaForCausalLM"], ["LlamaForSequenceClassification"]):
            raise ValueError(f"architectures {arch}, expected LlamaForCausalLM or "
                             "LlamaForSequenceClassification")
        if c.get("model_type", "llama") != "llama":
            raise ValueError(f"model_type {c.get('model_type')!r}, expected 'llama'")
        self.n_layer = int(c["num_hidden_layers"])
        self.n_head = int(c["num_attention_heads"])
        self.n_kv_head = int(c.get("num_key_value_heads", self.n_head))
        self.n_embd = int(c["hidden_size"])
        self.ffn_hidden = int(c["intermediate_size"])
        self.block_size = int(c["max_position_embeddings"])
        self.vocab_size = int(c["vocab_size"])
        self.eps = float(c["rms_norm_eps"])
        self.theta = float(c.get("rope_theta", 10000.0))
        if c.get("tie_word_embeddings", False):
            raise ValueError("tie_word_embeddings true: this reference has an untied lm_head")
        if c.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {c.get('hidden_act')!r}, expected 'silu'")
        if self.n_embd % self.n_head or self.n_head % self.n_kv_head:
            raise ValueError(f"hidden {self.n_embd}, heads {self.n_head}, kv heads "
                             f"{self.n_kv_head}: not divisible")
        self.head_dim = self.n_embd // self.n_head
        if int(c.get("head_dim", self.head_dim)) != self.head_dim:
            raise ValueError(f"head_dim {c['head_dim']} != hidden_size / num_attention_heads")
        if self.head_dim % 2:
            raise ValueError(f"RoPE needs an even head size (got {self.head_dim})")

    @classmethod
    def from_json(cls, path):
        with open(path) as f:
            return cls(json.load(f))

    def __repr__(self):
        return (f"LlamaConfig(n_layer={self.n_layer}, n_head={self.n_head}, "
                f"n_kv_head={self.n_kv_head}, n_embd={self.n_embd}, "
                f"ffn_hidden={self.ffn_hidden}, block_size={self.block_size}, "
                f"vocab_size={self.vocab_size}, eps={self.eps}, theta={self.theta})")


def param_shapes(cfg):
    """Expected {name: shape} (HF LlamaForCausalLM names)."""
    C, V, F_ = cfg.n_embd, cfg.vocab_size, cfg.ffn_hidden
    hd = cfg.head_dim
    s = {"model.embed_tokens.weight": (V, C), "model.norm.weight": (C,),
         "lm_head.weight": (V, C)}
    for i in range(cfg.n_layer):
        p = f"model.layers.{i}."
        s[p + "input_layernorm.weight"] = (C,)
        s[p + "self_attn.q_proj.weight"] = (cfg.n_head * hd, C)
        s[p + "self_attn.k_proj.weight"] = (cfg.n_kv_head * hd, C)
        s[p + "self_attn.v_proj.weight"] = (cfg.n_kv_head * hd, C)
        s[p + "self_attn.o_proj.weight"] = (C, cfg.n_head * hd)
        s[p + "post_attention_layernorm.weight"] = (C,)
        s[p + "mlp.gate_proj.weight"] = (F_, C)
        s[p + "mlp.up_proj.weight"] = (F_, C)
        s[p + "mlp.down_proj.weight"] = (C, F_)
    return s


def load_model(checkpoint_dir, dtype=torch.float32, requires_grad=True):
    """(params, cfg) from a trellis llama checkpoint directory."""
    cfg = LlamaConfig.from_json(os.path.join(checkpoint_dir, "config.json"))
    return load_params(checkpoint_dir, param_shapes(cfg), dtype, requires_grad), cfg


def random_model(cfg, seed=0, dtype=torch.float32):
    """Random parameters (N(0, 0.02) weights, norms around 1) for self-checks."""
    return random_params(param_shapes(cfg), seed, dtype)


# ---------------------------------------------------------------------------
# forward
# ---------------------------------------------------------------------------


def rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_angles(T, hd, theta):
    """cos, sin [T, hd/2] of the angles pos * theta^(-2d/hd) (computed in float64)."""
    inv_freq = theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return ang.cos(), ang.sin()


def rope(x, theta):
    """Rotate x [..., T, hd]: pairs (x[d], x[d + hd/2]) by pos * theta^(-2d/hd), pos = 0..T-1."""
    T, hd = x.shape[-2], x.shape[-1]
    cos, sin = rope_angles(T, hd, theta)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    a, b = x[..., : hd // 2], x[..., hd // 2 :]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def llama_hidden(params, cfg, idx, lengths=None):
    """idx [B,T] int64 -> model.norm output [B,T,C]; lengths [B]: keys >= lengths[b] masked too."""
    B, T = idx.shape
    H, Hkv, hd = cfg.n_head, cfg.n_kv_head, cfg.head_dim
    if T > cfg.block_size:
        raise ValueError(f"sequence length {T} exceeds max_position_embeddings {cfg.block_size}")
    x = drop.resid(params["model.embed_tokens.weight"][idx], 0, drop.EMBED)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    if lengths is not None:
        mask = mask & key_padding_mask(lengths, T)
    scale = 1.0 / math.sqrt(hd)
    kv_of = torch.arange(H) // (H // Hkv)  # kv head of each query head
    for i in range(cfg.n_layer):
        p = f"model.layers.{i}."
        n = rmsnorm(x, params[p + "input_layernorm.weight"], cfg.eps)
        q = (n @ params[p + "self_attn.q_proj.weight"].t()).view(B, T, H, hd).transpose(1, 2)
        k = (n @ params[p + "self_attn.k_proj.weight"].t()).view(B, T, Hkv, hd).transpose(1, 2)
        v = (n @ params[p + "self_attn.v_proj.weight"].t()).view(B, T, Hkv, hd).transpose(1, 2)
        q, k = rope(q, cfg.theta), rope(k, cfg.theta)
        k, v = k[:, kv_of], v[:, kv_of]  # [B, H, T, hd]
        att = (q @ k.transpose(-2, -1)) * scale
        att = torch.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        y = (drop.attn(att, i, drop.ATTN_PROBS) @ v).transpose(1, 2).reshape(B, T, H * hd)
        x = x + drop.resid(y @ params[p + "self_attn.o_proj.weight"].t(), i, drop.ATTN_OUT)
        n = rmsnorm(x, params[p + "post_attention_layernorm.weight"], cfg.eps)
        gate = n @ params[p + "mlp.gate_proj.weight"].t()
        up = n @ params[p + "mlp.up_proj.weight"].t()
        x = x + drop.resid((F.silu(gate) * up) @ params[p + "mlp.down_proj.weight"].t(), i,
                           drop.MLP_OUT)
    return rmsnorm(x, params["model.norm.weight"], cfg.eps)


def llama_logits(params, cfg, idx):
    """idx [B,T] int64 -> logits [B,T,V]."""
    return llama_hidden(params, cfg, idx) @ params["lm_head.weight"].t()


def llama_loss(params, cfg, idx, targets, label_smoothing=0.0):
    """Mean cross-entropy over all B*T targets (label-smoothed by PyTorch's own definition)."""
    return lm_loss(llama_logits(params, cfg, idx), targets, label_smoothing)

