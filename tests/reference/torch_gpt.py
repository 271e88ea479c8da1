"""PyTorch reference GPT-2 for checking trellis.

* `load_model(checkpoint_dir)`: the parameters of a trellis checkpoint
  (model.safetensors + config.json) as a dict of named torch tensors
  (float32 by default, requires_grad).
* `gpt_loss(params, cfg, idx, targets)`: forward pass -> mean cross-entropy loss.
* `gpt_hidden(params, cfg, idx, lengths)`: the final LayerNorm's output [B,T,C]; with
  `lengths` [B] the keys at positions >= lengths[b] are masked as well (padding; the task
  heads of reference/torch_tasks.py read these states).
* `random_model(cfg)`: the same model with GPT-2 style random init (benchmarks).

The pieces every reference shares (safetensors, checkpoint loading, token shards, masks) are
in torch_ref.py.

Model (HF GPT-2 names, Conv1D layout y = x @ W + b): wte [V,C], wpe [block,C],
pre-LN blocks h.i.{ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj},
ln_f, logits = ln_f(x) @ wte^T (tied), LayerNorm eps 1e-5, tanh GELU, causal
softmax attention scaled by 1/sqrt(head_size), no dropout.
"""

import json
import math
import os

import torch

from reference import dropout_masks as drop  # identity unless a test sets drop.ACTIVE
from reference.torch_ref import gelu_tanh, key_padding_mask, layer_norm, lm_loss, load_params


# ---------------------------------------------------------------------------
# config / parameters
# ---------------------------------------------------------------------------


class GPTConfig:
    def __init__(self, n_layer, n_head, n_embd, block_size, vocab_size):
        self.n_layer = int(n_layer)
        self.n_head = int(n_head)
        self.n_embd = int(n_embd)
        self.block_size = int(block_size)
        self.vocab_size = int(vocab_size)
        assert self.n_embd % self.n_head == 0

    @classmethod
    def from_json(cls, path):
        with open(path) as f:
            c = json.load(f)
        return cls(c["n_layer"], c["n_head"], c["n_embd"], c["n_positions"], c["vocab_size"])

    def __repr__(self):
        return (f"GPTConfig(n_layer={self.n_layer}, n_head={self.n_head}, n_embd={self.n_embd}, "
                f"block_size={self.block_size}, vocab_size={self.vocab_size})")


def param_shapes(cfg):
    """Expected {name: shape} of a GPT-2 with config cfg (HF names, true vocab)."""
    C, V = cfg.n_embd, cfg.vocab_size
    s = {"wte.weight": (V, C), "wpe.weight": (cfg.block_size, C),
         "ln_f.weight": (C,), "ln_f.bias": (C,)}
    for i in range(cfg.n_layer):
        p = f"h.{i}."
        s[p + "ln_1.weight"] = (C,)
        s[p + "ln_1.bias"] = (C,)
        s[p + "attn.c_attn.weight"] = (C, 3 * C)
        s[p + "attn.c_attn.bias"] = (3 * C,)
        s[p + "attn.c_proj.weight"] = (C, C)
        s[p + "attn.c_proj.bias"] = (C,)
        s[p + "ln_2.weight"] = (C,)
        s[p + "ln_2.bias"] = (C,)
        s[p + "mlp.c_fc.weight"] = (C, 4 * C)
        s[p + "mlp.c_fc.bias"] = (4 * C,)
        s[p + "mlp.c_proj.weight"] = (4 * C, C)
        s[p + "mlp.c_proj.bias"] = (C,)
    return s


def is_decayed(name, tensor):
    """trellis (and the usual GPT-2 recipe) decays only 2-D weights."""
    return tensor.dim() == 2


def load_model(checkpoint_dir, dtype=torch.float32, requires_grad=True):
    """(params, cfg) from a trellis checkpoint directory (model.safetensors + config.json)."""
    cfg = GPTConfig.from_json(os.path.join(checkpoint_dir, "config.json"))
    return load_params(checkpoint_dir, param_shapes(cfg), dtype, requires_grad), cfg


def random_model(cfg, seed=0, dtype=torch.float32, device="cpu"):
    """GPT-2 style init: N(0, 0.02), residual projections N(0, 0.02/sqrt(2L)), LN = 1/0."""
    g = torch.Generator().manual_seed(seed)
    params = {}
    proj_std = 0.02 / math.sqrt(2 * cfg.n_layer)
    for name, shape in param_shapes(cfg).items():
        if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight":
            t = torch.ones(shape, dtype=dtype)
        elif name.endswith(".bias"):
            t = torch.zeros(shape, dtype=dtype)
        else:
            std = proj_std if name.endswith("c_proj.weight") else 0.02
            t = torch.randn(shape, generator=g, dtype=torch.float32).mul_(std).to(dtype)
        params[name] = t.to(device).requires_grad_(True)
    return params


# ---------------------------------------------------------------------------
# forward
# ---------------------------------------------------------------------------


def gpt_hidden(params, cfg, idx, lengths=None):
    """idx [B,T] int64 -> ln_f output [B,T,C]; lengths [B]: keys >= lengths[b] masked too."""
    B, T = idx.shape
    C, nh = cfg.n_embd, cfg.n_head
    hs = C // nh
    if T > cfg.block_size:
        raise ValueError(f"sequence length {T} exceeds block size {cfg.block_size}")
    pos = torch.arange(T, device=idx.device)
    x = drop.resid(params["wte.weight"][idx] + params["wpe.weight"][pos], 0, drop.EMBED)
    mask = torch.ones(T, T, dtype=torch.bool, device=idx.device).tril()
    if lengths is not None:
        mask = mask & key_padding_mask(lengths, T)
    scale = 1.0 / math.sqrt(hs)
    for i in range(cfg.n_layer):
        p = f"h.{i}."
        h = layer_norm(x, params, p + "ln_1", 1e-5)
        qkv = h @ params[p + "attn.c_attn.weight"] + params[p + "attn.c_attn.bias"]
        q, k, v = qkv.split(C, dim=2)
        q = q.view(B, T, nh, hs).transpose(1, 2)
        k = k.view(B, T, nh, hs).transpose(1, 2)
        v = v.view(B, T, nh, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * scale
        att = att.masked_fill(~mask, float("-inf"))
        att = drop.attn(torch.softmax(att, dim=-1), i, drop.ATTN_PROBS)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + drop.resid(y @ params[p + "attn.c_proj.weight"] + params[p + "attn.c_proj.bias"],
                           i, drop.ATTN_OUT)
        h = layer_norm(x, params, p + "ln_2", 1e-5)
        h = gelu_tanh(h @ params[p + "mlp.c_fc.weight"] + params[p + "mlp.c_fc.bias"])
        x = x + drop.resid(h @ params[p + "mlp.c_proj.weight"] + params[p + "mlp.c_proj.bias"],
                           i, drop.MLP_OUT)
    return layer_norm(x, params, "ln_f", 1e-5)


def gpt_logits(params, cfg, idx):
    """idx [B,T] int64 -> logits [B,T,V]."""
    return gpt_hidden(params, cfg, idx) @ params["wte.weight"].t()


def gpt_loss(params, cfg, idx, targets, label_smoothing=0.0):
    """Mean cross-entropy over all B*T targets (label-smoothed by PyTorch's own definition)."""
    return lm_loss(gpt_logits(params, cfg, idx), targets, label_smoothing)
