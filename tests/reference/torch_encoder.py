"""PyTorch reference bidirectional Transformer encoder for checking trellis (torch ops only).

* `load_model(checkpoint_dir, dtype)`: (params, cfg) from a trellis checkpoint
  (model.safetensors + config.json); params are leaf tensors requiring grad.
* `encoder_loss(params, cfg, idx, targets)`: forward pass -> mean cross-entropy loss.
* `encoder_hidden(params, cfg, idx, lengths, features)`: the final LayerNorm's output [B,T,C];
  with `lengths` [B] the keys at positions >= lengths[b] are masked (padding); with `features`
  [B,T,F] the input is embed_features(features) instead of embed_tokens[idx].

Model (fairseq/BART-style names, pre-LayerNorm, nn.Linear layout [out, in], y = x @ W^T + b):
  h = embed_tokens.weight[idx] (+ the mean of embed_ngrams.weight over each token's subword
      n-gram bag, reference/subword_ngrams.py, when config.json's trellis.blocks has
      subword_ngrams) + embed_positions.weight[0..T-1]
  per layer i (prefix layers.{i}.):
    n = LN(h; self_attn_layer_norm)
    q, k, v = self_attn.{q,k,v}_proj(n)  as H heads of hd = C / H
    h = h + self_attn.out_proj(softmax(q k^T / sqrt(hd)) v)   (bidirectional: no causal mask;
                                                       padding keys masked given lengths)
    h = h + fc2(gelu_tanh(fc1(LN(h; final_layer_norm))))
  logits = LN(h; layer_norm) @ embed_tokens.weight^T   (LM head tied to the embedding)
Two of trellis's block choices (config.json trellis.blocks, which HF configs cannot say) are
modelled: mlp "none" (attention-only blocks: no final_layer_norm, fc1, fc2) and input_features
F > 0 (h = features @ embed_features.weight^T + embed_features.bias + positions, no
embed_tokens); any other choice than the family's is refused.
LayerNorm eps = layer_norm_eps (1e-5); gelu_tanh = HF gelu_new; no dropout. The loss is the
mean next-token cross-entropy over all B*T targets; with bidirectional attention this head
can see its target, it only exists to test the encoder's forward and backward.
"""

import json
import math
import os

import torch

from reference import dropout_masks as drop  # identity unless a test sets drop.ACTIVE
from reference import subword_ngrams
from reference.torch_ref import (gelu_tanh, key_padding_mask, layer_norm, linear, lm_loss,
                                 load_params, random_params)


class EncoderConfig:
    def __init__(self, c):
        arch = c.get("architectures")
        if arch is not None and arch != ["TrellisEncoder"]:
            raise ValueError(f"architectures {arch}, expected ['TrellisEncoder']")
        if c.get("model_type", "trellis-encoder") != "trellis-encoder":
            raise ValueError(f"model_type {c.get('model_type')!r}, expected 'trellis-encoder'")
        self.n_layer = int(c["num_hidden_layers"])
        self.n_head = int(c["num_attention_heads"])
        self.n_embd = int(c["hidden_size"])
        self.ffn_hidden = int(c["intermediate_size"])
        self.block_size = int(c["max_position_embeddings"])
        self.vocab_size = int(c["vocab_size"])
        self.eps = float(c.get("layer_norm_eps", 1e-5))
        if not c.get("tie_word_embeddings", True):
            raise ValueError("tie_word_embeddings false: this reference ties the LM head")
        if c.get("hidden_act", "gelu_new") != "gelu_new":
            raise ValueError(f"hidden_act {c.get('hidden_act')!r}, expected 'gelu_new'")
        if self.n_embd % self.n_head:
            raise ValueError(f"hidden {self.n_embd} not divisible by {self.n_head} heads")
        self.head_dim = self.n_embd // self.n_head
        blocks = c.get("trellis", {}).get("blocks", {})
        self.mlp = blocks.get("mlp", "gelu")
        self.input_features = int(blocks.get("input_features", 0))
        # fastText-style subword features (reference/subword_ngrams.py): 0 = none
        self.subword_ngrams = int(blocks.get("subword_ngrams", 0))
        self.ngram_min = int(blocks.get("ngram_min", 2))
        self.ngram_max = int(blocks.get("ngram_max", 5))
        want = {"norm": "layernorm", "positions": "learned", "bias": True}
        for key, value in want.items():
            if blocks.get(key, value) != value:
                raise ValueError(f"trellis.blocks.{key} {blocks[key]!r}: this reference models "
                                 f"{value!r} only")
        if self.mlp not in ("gelu", "none"):
            raise ValueError(f"trellis.blocks.mlp {self.mlp!r}: this reference models gelu, none")

    @classmethod
    def from_json(cls, path):
        with open(path) as f:
            return cls(json.load(f))

    def __repr__(self):
        return (f"EncoderConfig(n_layer={self.n_layer}, n_head={self.n_head}, "
                f"n_embd={self.n_embd}, ffn_hidden={self.ffn_hidden}, "
                f"block_size={self.block_size}, vocab_size={self.vocab_size}, eps={self.eps})")


def param_shapes(cfg):
    """Expected {name: shape}."""
    C, V, F_ = cfg.n_embd, cfg.vocab_size, cfg.ffn_hidden
    s = {"embed_positions.weight": (cfg.block_size, C),
         "layer_norm.weight": (C,), "layer_norm.bias": (C,)}
    features = cfg.input_features
    if features:
        s["embed_features.weight"], s["embed_features.bias"] = (C, features), (C,)
    else:
        s["embed_tokens.weight"] = (V, C)
    if cfg.subword_ngrams:
        s["embed_ngrams.weight"] = (cfg.subword_ngrams, C)
    for i in range(cfg.n_layer):
        p = f"layers.{i}."
        s[p + "self_attn_layer_norm.weight"] = (C,)
        s[p + "self_attn_layer_norm.bias"] = (C,)
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            s[p + f"self_attn.{proj}.weight"] = (C, C)
            s[p + f"self_attn.{proj}.bias"] = (C,)
        if cfg.mlp == "none":
            continue
        s[p + "final_layer_norm.weight"] = (C,)
        s[p + "final_layer_norm.bias"] = (C,)
        s[p + "fc1.weight"] = (F_, C)
        s[p + "fc1.bias"] = (F_,)
        s[p + "fc2.weight"] = (C, F_)
        s[p + "fc2.bias"] = (C,)
    return s


def load_model(checkpoint_dir, dtype=torch.float32, requires_grad=True):
    """(params, cfg) from a trellis encoder checkpoint directory."""
    cfg = EncoderConfig.from_json(os.path.join(checkpoint_dir, "config.json"))
    return load_params(checkpoint_dir, param_shapes(cfg), dtype, requires_grad), cfg


def random_model(cfg, seed=0, dtype=torch.float32):
    """Random parameters (N(0, 0.02) weights and biases, LN around 1/0) for self-checks."""
    return random_params(param_shapes(cfg), seed, dtype)


# ---------------------------------------------------------------------------
# forward
# ---------------------------------------------------------------------------


def encoder_hidden(params, cfg, idx=None, lengths=None, features=None, embedded=None):
    """idx [B,T] int64 (or features [B,T,F], or inputs already embedded [B,T,C]) -> layer_norm
    output [B,T,C]; lengths [B]: keys at positions >= lengths[b] are masked."""
    given = next(t for t in (embedded, features, idx) if t is not None)
    B, T = given.shape[:2]
    C, H, hd = cfg.n_embd, cfg.n_head, cfg.head_dim
    if T > cfg.block_size:
        raise ValueError(f"sequence length {T} exceeds max_position_embeddings {cfg.block_size}")
    if embedded is not None:
        x = embedded
    elif features is not None:
        x = linear(features, params, "embed_features")
    else:
        x = params["embed_tokens.weight"][idx]
        if cfg.subword_ngrams:
            x = x + ngram_means(params["embed_ngrams.weight"], cfg, idx)
    x = drop.resid(x + params["embed_positions.weight"][torch.arange(T)], 0, drop.EMBED)
    mask = None if lengths is None else key_padding_mask(lengths, T)
    scale = 1.0 / math.sqrt(hd)
    for i in range(cfg.n_layer):
        p = f"layers.{i}."
        n = layer_norm(x, params, p + "self_attn_layer_norm", cfg.eps)
        q = linear(n, params, p + "self_attn.q_proj").view(B, T, H, hd).transpose(1, 2)
        k = linear(n, params, p + "self_attn.k_proj").view(B, T, H, hd).transpose(1, 2)
        v = linear(n, params, p + "self_attn.v_proj").view(B, T, H, hd).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * scale
        if mask is not None:
            att = att.masked_fill(~mask, float("-inf"))
        att = drop.attn(torch.softmax(att, dim=-1), i, drop.ATTN_PROBS)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + drop.resid(linear(y, params, p + "self_attn.out_proj"), i, drop.ATTN_OUT)
        if cfg.mlp == "none":
            continue
        n = layer_norm(x, params, p + "final_layer_norm", cfg.eps)
        x = x + drop.resid(linear(gelu_tanh(linear(n, params, p + "fc1")), params, p + "fc2"),
                           i, drop.MLP_OUT)
    return layer_norm(x, params, "layer_norm", cfg.eps)


def ngram_means(table, cfg, idx):
    """[B,T,C]: per token the mean of the table rows of its bag (zero for an empty bag)."""
    B, T = idx.shape
    rows = []
    for b in range(B):
        for grams in subword_ngrams.bags(idx[b].tolist(), cfg.subword_ngrams, cfg.ngram_min,
                                         cfg.ngram_max):
            rows.append(table[torch.tensor(grams, dtype=torch.int64)].mean(0) if grams
                        else torch.zeros(table.shape[1], dtype=table.dtype))
    return torch.stack(rows).view(B, T, -1)


def encoder_logits(params, cfg, idx):
    """idx [B,T] int64 -> logits [B,T,V]."""
    return encoder_hidden(params, cfg, idx) @ params["embed_tokens.weight"].t()


def encoder_loss(params, cfg, idx, targets, label_smoothing=0.0):
    """Mean cross-entropy over all B*T targets (label-smoothed by PyTorch's own definition)."""
    return lm_loss(encoder_logits(params, cfg, idx), targets, label_smoothing)

