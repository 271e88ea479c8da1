"""PyTorch reference GPT-2 for checking trellis.

* `load_safetensors` / `save_safetensors`: a stdlib + numpy safetensors reader and
  writer (no dependency on the `safetensors` package).
* `load_model(checkpoint_dir)`: the parameters of a trellis checkpoint
  (model.safetensors + config.json) as a dict of named torch tensors
  (float32 by default, requires_grad).
* `gpt_loss(params, cfg, idx, targets)`: forward pass -> mean cross-entropy loss.
* `gpt_hidden(params, cfg, idx, lengths)`: the final LayerNorm's output [B,T,C]; with
  `lengths` [B] the keys at positions >= lengths[b] are masked as well (padding; the task
  heads of reference/torch_tasks.py read these states).
* `key_padding_mask(lengths, Tk)`: [B,1,1,Tk] bool, True where a key is real.
* `random_model(cfg)`: the same model with GPT-2 style random init (benchmarks).
* `read_tokens` / `windows`: llm.c token shards and trellis' window layout.

Model (HF GPT-2 names, Conv1D layout y = x @ W + b): wte [V,C], wpe [block,C],
pre-LN blocks h.i.{ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj},
ln_f, logits = ln_f(x) @ wte^T (tied), LayerNorm eps 1e-5, tanh GELU, causal
softmax attention scaled by 1/sqrt(head_size), no dropout.
"""

import json
import math
import os
import struct

import numpy as np
import torch
import torch.nn.functional as F

from reference import dropout_masks as drop  # identity unless a test sets drop.ACTIVE

# ---------------------------------------------------------------------------
# safetensors
# ---------------------------------------------------------------------------

_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "U16": np.uint16,
    "U32": np.uint32,
    "U64": np.uint64,
    "BOOL": np.bool_,
}
_NAMES = {np.dtype(v): k for k, v in _DTYPES.items()}


def _bf16_to_f32(raw):
    u = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
    return u.view(np.float32)


def load_safetensors(path, with_metadata=False):
    """Read a .safetensors file -> {name: numpy array} (and the __metadata__ dict)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (hlen,) = struct.unpack("<Q", data[:8])
    if 8 + hlen > len(data):
        raise ValueError(f"{path}: header length {hlen} runs past the end of the file")
    header = json.loads(data[8 : 8 + hlen].decode("utf-8"))
    base = 8 + hlen
    meta = header.pop("__metadata__", {}) or {}
    out = {}
    for name, info in header.items():
        start, end = info["data_offsets"]
        shape = tuple(info["shape"])
        raw = data[base + start : base + end]
        dt = info["dtype"]
        if dt == "BF16":
            arr = _bf16_to_f32(raw)
        elif dt in _DTYPES:
            arr = np.frombuffer(raw, dtype=np.dtype(_DTYPES[dt]).newbyteorder("<"))
        else:
            raise ValueError(f"{path}: tensor {name}: unsupported dtype {dt}")
        n = int(np.prod(shape)) if shape else 1
        if arr.size != n:
            raise ValueError(f"{path}: tensor {name}: {arr.size} elements for shape {shape}")
        out[name] = arr.reshape(shape).copy()
    return (out, meta) if with_metadata else out


def save_safetensors(path, tensors, metadata=None):
    """Write {name: numpy array or torch tensor} as .safetensors (names sorted)."""
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        a = tensors[name]
        if isinstance(a, torch.Tensor):
            a = a.detach().cpu().numpy()
        a = np.ascontiguousarray(a)
        if a.dtype not in _NAMES:
            raise ValueError(f"tensor {name}: unsupported dtype {a.dtype}")
        b = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {
            "dtype": _NAMES[a.dtype],
            "shape": list(a.shape),
            "data_offsets": [offset, offset + len(b)],
        }
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


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


def load_params(checkpoint_dir, expected, dtype=torch.float32, requires_grad=True):
    """{name: tensor} from checkpoint_dir/model.safetensors, which must hold exactly the tensors
    of `expected` ({name: shape}) with those shapes (every reference model loads through this)."""
    if os.path.exists(os.path.join(checkpoint_dir, "index.json")):
        # A sharded training checkpoint: assembled by the tests' own reader of its index.
        from trellis_test import checkpoint_tensors
        arrays = checkpoint_tensors(checkpoint_dir)
    else:
        arrays = load_safetensors(os.path.join(checkpoint_dir, "model.safetensors"))
    missing = sorted(set(expected) - set(arrays))
    extra = sorted(set(arrays) - set(expected))
    if missing or extra:
        raise ValueError(f"{checkpoint_dir}: missing tensors {missing}, unexpected {extra}")
    params = {}
    for name, shape in expected.items():
        a = arrays[name]
        if tuple(a.shape) != tuple(shape):
            raise ValueError(f"{checkpoint_dir}: {name} has shape {a.shape}, expected {shape}")
        params[name] = torch.tensor(a, dtype=dtype).requires_grad_(requires_grad)
    return params


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


def _gelu(x):
    return F.gelu(x, approximate="tanh")


def key_padding_mask(lengths, Tk):
    """[B,1,1,Tk] bool: True where key position < lengths[b] (broadcasts over heads, queries)."""
    lengths = torch.as_tensor(lengths)
    return (torch.arange(Tk)[None, :] < lengths[:, None])[:, None, None, :]


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
        h = F.layer_norm(x, (C,), params[p + "ln_1.weight"], params[p + "ln_1.bias"], 1e-5)
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
        h = F.layer_norm(x, (C,), params[p + "ln_2.weight"], params[p + "ln_2.bias"], 1e-5)
        h = _gelu(h @ params[p + "mlp.c_fc.weight"] + params[p + "mlp.c_fc.bias"])
        x = x + drop.resid(h @ params[p + "mlp.c_proj.weight"] + params[p + "mlp.c_proj.bias"],
                           i, drop.MLP_OUT)
    return F.layer_norm(x, (C,), params["ln_f.weight"], params["ln_f.bias"], 1e-5)


def gpt_logits(params, cfg, idx):
    """idx [B,T] int64 -> logits [B,T,V]."""
    return gpt_hidden(params, cfg, idx) @ params["wte.weight"].t()


def gpt_loss(params, cfg, idx, targets, label_smoothing=0.0):
    """Mean cross-entropy over all B*T targets (label-smoothed by PyTorch's own definition)."""
    logits = gpt_logits(params, cfg, idx)
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1),
                           label_smoothing=label_smoothing)


# ---------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------

SHARD_MAGIC = 20240520


def read_tokens(path):
    """Tokens of one llm.c shard (256 int32 header, then uint16 tokens) as int64 numpy."""
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(256 * 4), dtype="<i4")
        if header.size != 256 or header[0] != SHARD_MAGIC:
            raise ValueError(f"{path}: not an llm.c token shard (magic {header[:1]})")
        n = int(header[2])
        toks = np.frombuffer(f.read(2 * n), dtype="<u2")
    if toks.size != n:
        raise ValueError(f"{path}: header says {n} tokens, file holds {toks.size}")
    return toks.astype(np.int64)


def read_split(datadir, split="train"):
    """Concatenated tokens of DATADIR/<split>*.bin in name order."""
    names = sorted(n for n in os.listdir(datadir) if n.startswith(split) and n.endswith(".bin"))
    if not names:
        raise ValueError(f"{datadir}: no {split}*.bin shards")
    return np.concatenate([read_tokens(os.path.join(datadir, n)) for n in names])


def windows(tokens, T, ids):
    """(inputs, targets) int64 tensors [len(ids), T]; window w = tokens[w*T : w*T+T+1]."""
    xs, ys = [], []
    for w in ids:
        chunk = tokens[w * T : w * T + T + 1]
        if chunk.size != T + 1:
            raise ValueError(f"window {w} of length {T} runs past the {tokens.size} tokens")
        xs.append(chunk[:-1])
        ys.append(chunk[1:])
    return torch.tensor(np.stack(xs)), torch.tensor(np.stack(ys))
