"""What the PyTorch reference models (torch_gpt, torch_llama, torch_encoder, torch_encdec,
torch_tasks) share, in one place so that each model file holds only its own architecture.

Like the models, this is written from torch ops and the file formats' descriptions alone: it
never imports or calls trellis code (trellis_test's checkpoint reader is the tests' own).

* `load_safetensors` / `save_safetensors`: a stdlib + numpy safetensors reader and writer (no
  dependency on the `safetensors` package).
* `load_params(checkpoint_dir, expected)`: the named tensors of a trellis checkpoint, checked
  against the model's {name: shape}.
* `random_params(shapes)`: N(0, 0.02) weights and biases, norm weights around 1 and biases
  around 0 (self-checks of the references).
* `linear`, `layer_norm`, `gelu_tanh`, `key_padding_mask`, `lm_loss`: the layers the models
  build from.
* `read_tokens` / `read_split` / `windows`: llm.c token shards and trellis' window layout.
"""

import json
import os
import struct

import numpy as np
import torch
import torch.nn.functional as F

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
# parameters
# ---------------------------------------------------------------------------


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


def random_params(shapes, seed=0, dtype=torch.float32):
    """{name: leaf tensor} for {name: shape}, drawn in float64 in the order given: norm weights
    1 + N(0, 0.1), norm biases N(0, 0.1), everything else N(0, 0.02)."""
    g = torch.Generator().manual_seed(seed)
    params = {}
    for name, shape in shapes.items():
        t = torch.randn(shape, generator=g, dtype=torch.float64)
        if name.endswith("norm.weight"):
            t = 1.0 + 0.1 * t
        elif name.endswith("norm.bias"):
            t = 0.1 * t
        else:
            t = 0.02 * t
        params[name] = t.to(dtype).requires_grad_(True)
    return params


# ---------------------------------------------------------------------------
# layers
# ---------------------------------------------------------------------------


def linear(x, params, prefix):
    """nn.Linear layout: x @ {prefix}.weight^T + {prefix}.bias."""
    return x @ params[prefix + ".weight"].t() + params[prefix + ".bias"]


def layer_norm(x, params, prefix, eps):
    """LayerNorm over the last dimension with {prefix}.weight and {prefix}.bias."""
    return F.layer_norm(x, (x.size(-1),), params[prefix + ".weight"], params[prefix + ".bias"],
                        eps)


def gelu_tanh(x):
    """GELU, tanh approximation (GPT-2's and HF's gelu_new)."""
    return F.gelu(x, approximate="tanh")


def key_padding_mask(lengths, Tk):
    """[B,1,1,Tk] bool: True where key position < lengths[b] (broadcasts over heads, queries)."""
    lengths = torch.as_tensor(lengths)
    return (torch.arange(Tk)[None, :] < lengths[:, None])[:, None, None, :]


def lm_loss(logits, targets, label_smoothing=0.0):
    """Mean cross-entropy of logits [..., V] over all targets (label-smoothed by PyTorch's own
    definition)."""
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
