"""PyTorch reference of trellis's task models (classification, translation), for checking trellis.

Built on the independent reference models (torch_gpt, torch_llama, torch_encoder, torch_encdec),
whose `*_hidden` functions mask padding keys given sequence lengths. This module adds what a task
puts around them:

* `read_examples(path)`, `write_examples(path, examples)`, `read_task(dir)`: task data
  directories (`trellis prepare --task`; format in src/trellis/data/examples.h):
  [(label, source values, target values)].
* `load_model(checkpoint_dir, dtype)`: (params, TaskConfig) of a task checkpoint: the family's
  parameters without its language-model head, plus the task head.
* `make_batch(cfg, examples, ids)`: the model inputs of examples `ids`, laid out as trellis's
  SequenceFormat documents it (src/trellis/train/batches.h), written here from that description:
    classify (tokens):   [S] text [S], the text truncated to T - 2, then S up to T; length = the
                         real positions (text + 2); the label.
    classify (features): the example's patches, each pixel byte / 255, then zero patches up to T;
                         length = the number of patches. With the checkpoint's patch_context
                         (make_batch then needs the directory's meta for the image geometry) the
                         batch holds the images instead, and `hidden` embeds them with
                         torch.nn.functional.conv2d: kernel (2c+1) patches, stride one patch,
                         zero padding c patches, its kernel embed_features.weight read as
                         [C, 2c+1, 2c+1, patch rows, patch columns].
    translate:           encoder input source [S], decoder input [S] target, decoder targets
                         target [S]; each padded to T with S (targets with -1); length = the
                         source's real positions (source + 1).
  S is the task's special token. Returned as a dict of tensors (tokens / features, src, lengths,
  labels, targets).
* `task_loss(params, cfg, batch)`: the loss trellis trains on:
    classify:  final norm -> pooling over the real positions (mean: average of t < length; cls:
               t = 0; last: t = length - 1, as GPT2ForSequenceClassification's last non-padding
               token) -> head (encoder: classifier.weight [K, C] and classifier.bias; gpt2 and
               llama: score.weight [K, C], no bias, as HF's *ForSequenceClassification) ->
               mean cross-entropy over the batch's labels.
    translate: mean cross-entropy over the real targets (padding -1 ignored), the decoder's
               self-attention causal only, the source's padding keys masked in the encoder and in
               cross-attention.
  Attention masks: an encoder (and an encoder-decoder's encoder and cross-attention) masks the
  keys at positions >= length; a decoder classifier's attention is causal and masks them as well
  (for its real positions the causal mask already hides the padding after them).
"""

import json
import os
import struct

import torch
import torch.nn.functional as F

from reference import dropout_masks as drop  # identity unless a test sets drop.ACTIVE
from reference import torch_encdec, torch_encoder, torch_gpt, torch_llama
from reference.torch_ref import linear, load_params
from trellis_test import read_examples  # noqa: E402,F401  (task data files)

# ---------------------------------------------------------------------------
# task data
# ---------------------------------------------------------------------------

_MAGIC = b"TRLSEXMP"


def write_examples(path, examples):
    """Writes [(label, source, target)] in the examples format (4-byte values)."""
    ends, values, pos = [], [], 0
    for _, source, target in examples:
        pos += len(source)
        ends.append(pos)
        pos += len(target)
        ends.append(pos)
        values += list(source) + list(target)
    n = len(examples)
    with open(path, "wb") as f:
        f.write(_MAGIC + struct.pack("<IIQ", 1, 4, n))
        f.write(struct.pack(f"<{n}i", *[e[0] for e in examples]))
        f.write(struct.pack(f"<{2 * n}Q", *ends))
        f.write(struct.pack(f"<{len(values)}I", *values))


def read_task(task_dir):
    """(meta dict, train examples, val examples) of a task directory."""
    with open(os.path.join(task_dir, "meta.json")) as f:
        meta = json.load(f)
    return (meta, read_examples(os.path.join(task_dir, "train.examples")),
            read_examples(os.path.join(task_dir, "val.examples")))


def needed(meta, source, target):
    """Positions an example needs before truncation (for checking trellis's seq_len)."""
    if meta.get("feature_dim", 0) > 0:
        return len(source) // meta["feature_dim"]
    if meta["task"] == "classify":
        return len(source) + 2
    return max(len(source), len(target)) + 1


# ---------------------------------------------------------------------------
# models
# ---------------------------------------------------------------------------

# the block choices (config.json trellis.blocks) each family's reference models
_BLOCKS = {
    "gpt2": {"norm": "layernorm", "positions": "learned", "mlp": "gelu", "bias": True},
    "llama": {"norm": "rmsnorm", "positions": "rope", "mlp": "swiglu", "bias": False},
}


class TaskConfig:
    """A task checkpoint's config.json: family, its reference config (`base`) and the task."""

    def __init__(self, c):
        arch = (c.get("architectures") or [""])[0]
        families = {"GPT2LMHeadModel": "gpt2", "GPT2ForSequenceClassification": "gpt2",
                    "LlamaForCausalLM": "llama", "LlamaForSequenceClassification": "llama",
                    "TrellisEncoder": "encoder", "TrellisEncoderDecoder": "encdec"}
        if arch not in families:
            raise ValueError(f"architectures {c.get('architectures')}: not a family modelled here")
        self.family = families[arch]
        tr = c.get("trellis", {})
        task = tr.get("task")
        if not task:
            raise ValueError("config.json has no trellis.task: not a task checkpoint")
        self.task = task["task"]
        self.T = int(task["seq_len"])
        self.special = int(task["special_token"])
        self.feature_dim = int(task.get("feature_dim", 0))
        self.patch_context = int(task.get("patch_context", 0))
        blocks = tr.get("blocks", {})
        for key, value in _BLOCKS.get(self.family, {}).items():
            if blocks.get(key, value) != value:
                raise ValueError(f"trellis.blocks.{key} {blocks[key]!r}: the {self.family} "
                                 f"reference models {value!r}")
        if self.family == "gpt2":
            self.base = torch_gpt.GPTConfig(c["n_layer"], c["n_head"], c["n_embd"],
                                            c["n_positions"], c["vocab_size"])
        elif self.family == "llama":
            self.base = torch_llama.LlamaConfig(c)
        elif self.family == "encoder":
            self.base = torch_encoder.EncoderConfig(c)
        else:
            self.base = torch_encdec.EncDecConfig(c)
        inputs = self.feature_dim * (2 * self.patch_context + 1) ** 2
        if self.feature_dim and getattr(self.base, "input_features", 0) != inputs:
            raise ValueError(f"task feature_dim {self.feature_dim} with patch_context "
                             f"{self.patch_context}, model input_features "
                             f"{getattr(self.base, 'input_features', 0)}")
        if self.task == "classify":
            self.num_classes = int(c["num_labels"])
            if int(blocks.get("num_classes", self.num_classes)) != self.num_classes:
                raise ValueError(f"num_labels {self.num_classes}, trellis.blocks.num_classes "
                                 f"{blocks['num_classes']}")
            self.pooling = blocks["pooling"]
            if self.pooling not in ("mean", "cls", "last"):
                raise ValueError(f"pooling {self.pooling!r}")
            if self.family == "encdec":
                raise ValueError("an encoder-decoder classifier is not modelled")
        elif self.task == "translate":
            if self.family != "encdec":
                raise ValueError(f"translation with a {self.family}: not modelled")
        else:
            raise ValueError(f"task {self.task!r}")

    @classmethod
    def from_json(cls, path):
        with open(path) as f:
            return cls(json.load(f))

    def __repr__(self):
        head = (f", {self.num_classes} classes, {self.pooling} pooling"
                if self.task == "classify" else "")
        return f"TaskConfig({self.family} {self.task}, T {self.T}{head}, {self.base})"


def param_shapes(cfg):
    """{name: shape}: the family's parameters, its language-model head replaced by the task's."""
    b = cfg.base
    if cfg.family == "gpt2":
        s = torch_gpt.param_shapes(b)  # tied head: no head tensor
    elif cfg.family == "llama":
        s = torch_llama.param_shapes(b)
        del s["lm_head.weight"]
    elif cfg.family == "encoder":
        s = torch_encoder.param_shapes(b)  # tied head (or feature inputs): no head tensor
    else:
        s = torch_encdec.param_shapes(b)  # translation keeps the tied output head
    if cfg.task == "classify":
        K, C = cfg.num_classes, b.n_embd
        if cfg.family == "encoder":
            s["classifier.weight"], s["classifier.bias"] = (K, C), (K,)
        else:
            s["score.weight"] = (K, C)
    return s


def load_model(checkpoint_dir, dtype=torch.float32, requires_grad=True):
    """(params, TaskConfig) from a trellis task checkpoint directory."""
    cfg = TaskConfig.from_json(os.path.join(checkpoint_dir, "config.json"))
    return load_params(checkpoint_dir, param_shapes(cfg), dtype, requires_grad), cfg


# ---------------------------------------------------------------------------
# batches
# ---------------------------------------------------------------------------


def _images(meta, rows):
    """[B, 1, H, W] float64 images (pixel / 255) rebuilt from the examples' patches, stored row
    by row of patches, each patch row by row (src/trellis/data/examples.h)."""
    im = meta["image"]
    H, W, ph, pw = im["height"], im["width"], im["patch_height"], im["patch_width"]
    out = torch.zeros(len(rows), 1, H, W, dtype=torch.float64)
    for b, (_, source, _) in enumerate(rows):
        p = torch.tensor(source, dtype=torch.float64).view(H // ph, W // pw, ph, pw) / 255.0
        out[b, 0] = p.permute(0, 2, 1, 3).reshape(H, W)
    return out


def make_batch(cfg, examples, ids, meta=None):
    """The model inputs of examples[i] for i in ids (see the module comment)."""
    T, S = cfg.T, cfg.special
    rows = [examples[i] for i in ids]
    B = len(rows)
    lengths = torch.zeros(B, dtype=torch.int64)
    batch = {"lengths": lengths}
    if cfg.task == "classify":
        batch["labels"] = torch.tensor([r[0] for r in rows], dtype=torch.int64)
        if cfg.patch_context:
            if meta is None or "image" not in meta:
                raise ValueError("patch_context: make_batch needs the meta.json with the images")
            batch["images"] = _images(meta, rows)
            batch["patch_shape"] = (meta["image"]["patch_height"], meta["image"]["patch_width"])
            n = batch["images"][0, 0].numel() // cfg.feature_dim
            if n > T:
                raise ValueError(f"images of {n} patches, more than T {T}")
            lengths.fill_(n)
        elif cfg.feature_dim:
            Fd = cfg.feature_dim
            feats = torch.zeros(B, T, Fd, dtype=torch.float64)
            for b, (_, source, _) in enumerate(rows):
                n = min(len(source) // Fd, T)
                px = torch.tensor(source[:n * Fd], dtype=torch.float64) / 255.0
                feats[b, :n] = px.view(n, Fd)
                lengths[b] = n
            batch["features"] = feats
        else:
            tokens = torch.full((B, T), S, dtype=torch.int64)
            for b, (_, source, _) in enumerate(rows):
                text = source[:T - 2]
                tokens[b, 1:1 + len(text)] = torch.tensor(text, dtype=torch.int64)
                lengths[b] = len(text) + 2
            batch["tokens"] = tokens
        return batch
    src = torch.full((B, T), S, dtype=torch.int64)
    tgt_in = torch.full((B, T), S, dtype=torch.int64)
    targets = torch.full((B, T), -1, dtype=torch.int64)
    for b, (_, source, target) in enumerate(rows):
        if max(len(source), len(target)) + 1 > T:
            raise ValueError(f"example {ids[b]} needs more than {T} positions")
        src[b, :len(source)] = torch.tensor(source, dtype=torch.int64)
        lengths[b] = len(source) + 1
        tgt_in[b, 1:1 + len(target)] = torch.tensor(target, dtype=torch.int64)
        targets[b, :len(target)] = torch.tensor(target, dtype=torch.int64)
        targets[b, len(target)] = S
    batch.update(src=src, tokens=tgt_in, targets=targets)
    return batch


# ---------------------------------------------------------------------------
# forward
# ---------------------------------------------------------------------------


def hidden(params, cfg, batch):
    """The final norm's output [B,T,C] of a classifier."""
    lengths = batch["lengths"]
    b = cfg.base
    if cfg.family == "gpt2":
        return torch_gpt.gpt_hidden(params, b, batch["tokens"], lengths)
    if cfg.family == "llama":
        return torch_llama.llama_hidden(params, b, batch["tokens"], lengths)
    if "images" in batch:
        return torch_encoder.encoder_hidden(params, b, lengths=lengths,
                                            embedded=conv_embedding(params, cfg, batch))
    feats = batch.get("features")
    if feats is not None:
        feats = feats.to(params["embed_features.weight"].dtype)
    return torch_encoder.encoder_hidden(params, b, batch.get("tokens"), lengths, feats)


def conv_embedding(params, cfg, batch):
    """[B, T, C]: the images through conv2d with embed_features as the kernel (module comment)."""
    w, bias = params["embed_features.weight"], params["embed_features.bias"]
    images = batch["images"].to(w.dtype)
    c, k = cfg.patch_context, 2 * cfg.patch_context + 1
    ph, pw = batch["patch_shape"]
    kernel = w.view(-1, k, k, ph, pw).permute(0, 1, 3, 2, 4).reshape(-1, 1, k * ph, k * pw)
    y = F.conv2d(images, kernel, bias, stride=(ph, pw), padding=(c * ph, c * pw))  # [B,C,h,w]
    x = y.flatten(2).transpose(1, 2)
    B, n, C = x.shape
    return torch.cat([x, x.new_zeros(B, cfg.T - n, C)], 1)


def pool(h, lengths, mode):
    """[B,T,C] -> [B,C] over each row's real positions t < lengths[b]."""
    B, T, _ = h.shape
    idx = torch.arange(B)
    if mode == "cls":
        return h[:, 0]
    if mode == "last":
        return h[idx, lengths - 1]
    real = (torch.arange(T)[None, :] < lengths[:, None]).to(h.dtype)  # [B,T]
    return (h * real[:, :, None]).sum(1) / lengths[:, None].to(h.dtype)


def class_logits(params, cfg, batch):
    pooled = drop.pooled(pool(hidden(params, cfg, batch), batch["lengths"], cfg.pooling))
    if cfg.family == "encoder":
        return linear(pooled, params, "classifier")
    return pooled @ params["score.weight"].t()


def task_loss(params, cfg, batch, _unused=None, label_smoothing=0.0):
    """Mean cross-entropy over the batch's targets (labels, or real target tokens), label-smoothed
    by PyTorch's own definition (ignored targets stay out of the mean).
    (_unused: the oracle's loss(params, cfg, x, y) calling convention, y = None.)"""
    if cfg.task == "classify":
        return F.cross_entropy(class_logits(params, cfg, batch), batch["labels"],
                               label_smoothing=label_smoothing)
    logits = torch_encdec.seq2seq_logits(params, cfg.base, batch["src"], batch["tokens"],
                                         batch["lengths"])
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), batch["targets"].reshape(-1),
                           ignore_index=-1, label_smoothing=label_smoothing)
