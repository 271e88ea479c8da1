#!/usr/bin/env python3
"""PyTorch oracle test for trellis (run by ctest; plain script).

Environment: TRELLIS_BIN (the trellis binary), TRELLIS_TMP (scratch directory,
created if missing), TRELLIS_SOURCE (repository root). PYTHONPATH must contain
<repo>/tests (it is added here too when TRELLIS_SOURCE is set).

Checks (every tensor compared norm-wise: ||trellis - torch|| / ||torch|| <= 1e-5):
  a. byte tokenizer, tiny GPT-2: loss and all gradients of `trellis grad` vs autograd.
  b. GPT-2 BPE tokenizer (vocab 50257, padded to 50304 inside trellis): same.
  c. 10 AdamW steps (warmup 2 + cosine, grad clip 1.0 that triggers, weight decay 0.1,
     no shuffling, batch 4 x 32): per-step loss and grad norm, final parameters and
     AdamW moments.
  d. as c with gradient accumulation (micro-batch 2 of batch 4).
  e. 10 SGD-momentum steps (batch 8 x 64, the data order wraps around, clip 1.5 so
     some steps clip and some do not): losses, grad norms,
     final parameters and momentum buffers.
  f. llama-tiny with grouped-query attention (4 heads over 2 kv heads, RoPE, RMSNorm,
     SwiGLU, untied head; reference reference/torch_llama.py): as a, byte tokenizer;
     first the reference's RoPE is pinned against HF's apply_rotary_pos_emb formula.
  g. llama-tiny: 10 AdamW steps as in c, from init seed 36 (a well-conditioned start, see
     the precondition below).
  h. encoder-tiny (bidirectional, pre-LN, learned positions, tied head; reference
     reference/torch_encoder.py): as a, byte tokenizer.
  i. encoder-tiny: 10 AdamW steps as in c.

Exception: a key bias has an exactly zero gradient (softmax ignores a shift shared by
all keys), so after AdamW steps its value is amplified rounding noise on both sides; it is
checked to have (almost) not moved instead of being compared (see check_train). That is
the key third of each GPT-2 attn.c_attn.bias and each encoder self_attn.k_proj.bias. Where
a whole tensor is such a zero (the encoder's k_proj.bias), its gradient and its optimizer
moments are checked to be zero up to rounding on both sides (norm <= 1e-5 of the
matching q_proj.bias tensor) instead of a relative error of noise against noise.

Precondition of the training cases (c, d, e, g, i; see COND_TOL): the reference is run in
float32 and in float64, and the two must agree within TOL/2 on everything compared, so that the
comparison with trellis measures trellis and not the rounding noise of ill-conditioned inputs.

A case that compares nothing (no gradient, no parameter, no optimizer tensor) fails.

Training cases: each step's learning rate is computed here from the schedule docs/training.md
documents (linear warmup, then cosine decay to min_lr at the last step) and drives the
reference; trellis's logged lr must equal it (1e-6 relative). The final checkpoint must hold
every optimizer tensor torch has (exp_avg/exp_avg_sq, or momentum_buffer, of every parameter):
a missing optimizer state or tensor fails.

Usage: test_torch_oracle.py [a b c d e f g h i]  (default: all cases)

Exit status 0 when every check passes; otherwise 1, with the failing case, step and
tensor named.
"""

import json
import math
import os
import random
import shutil
import subprocess
import sys
import time

import numpy as np

if os.environ.get("TRELLIS_SOURCE"):
    sys.path.insert(0, os.path.join(os.environ["TRELLIS_SOURCE"], "tests"))

import torch  # noqa: E402

from reference import torch_encoder, torch_gpt, torch_llama  # noqa: E402
from reference.torch_ref import load_safetensors, read_split, read_tokens, windows  # noqa: E402
from trellis_test import checkpoint_optimizer, checkpoint_tensors  # noqa: E402

TOL = 1e-5
THREADS = "2"
# The oracle computes in float32 like trellis; set TRELLIS_ORACLE_DTYPE=float64 to use a
# float64 reference instead (then the errors measure trellis alone).
DTYPE = torch.float64 if os.environ.get("TRELLIS_ORACLE_DTYPE") == "float64" else torch.float32
TINY = ["--model", "tiny", "--n-layer", "2", "--n-head", "2", "--n-embd", "32",
        "--block-size", "64"]


class Family:
    """A model under test: its trellis arguments, its reference (load_model + loss) and the
    parts of its parameters whose exact gradient is zero.

    zero_grad(name, cfg) -> None, or (index, ref_name, ref_index, label): tensor[index] has an
    exactly zero gradient; params[ref_name][ref_index] is the query bias it is measured
    against; label names what remains of the tensor for the comparison."""

    def __init__(self, name, args, load_model, loss, zero_grad=lambda name, cfg: None):
        self.name, self.args = name, list(args)
        self.load_model, self.loss, self.zero_grad = load_model, loss, zero_grad


def _gpt2_zero_grad(name, cfg):
    if name.endswith("attn.c_attn.bias"):
        C = cfg.n_embd
        return slice(C, 2 * C), name, slice(0, C), "[query,value thirds]"
    return None


def _encoder_zero_grad(name, cfg):
    if name.endswith("self_attn.k_proj.bias"):
        return slice(None), name[: -len("k_proj.bias")] + "q_proj.bias", slice(None), ""
    return None


GPT2 = Family("gpt2", TINY, torch_gpt.load_model, torch_gpt.gpt_loss, _gpt2_zero_grad)
LLAMA = Family("llama", ["--model", "llama-tiny", "--n-kv-head", "2"], torch_llama.load_model,
               torch_llama.llama_loss)
ENCODER = Family("encoder", ["--model", "encoder-tiny"], torch_encoder.load_model,
                 torch_encoder.encoder_loss, _encoder_zero_grad)


def whole_zero_grad(fam, name, cfg, shape):
    """(ref_name, ref_index) when all of tensor `name` has an exactly zero gradient."""
    z = fam.zero_grad(name, cfg)
    if z is None:
        return None
    keep = np.ones(shape, dtype=bool)
    keep[z[0]] = False
    return None if keep.any() else (z[1], z[2])

failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL " + msg, flush=True)


def rel(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    nb = np.linalg.norm(b)
    d = np.linalg.norm(a - b)
    if nb == 0.0:
        return 0.0 if d == 0.0 else float("inf")
    return float(d / nb)


def run(args, **kw):
    cmd = [BIN] + [str(a) for a in args]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    if p.returncode != 0:
        raise RuntimeError(f"command failed ({p.returncode}): {' '.join(cmd)}\n"
                           f"stdout: {p.stdout}\nstderr: {p.stderr}")
    return p.stdout


def corpus(path, nbytes=6000, seed=1234):
    """Deterministic English-ish text."""
    r = random.Random(seed)
    subj = ["the old sailor", "a young fox", "my neighbour", "the teacher", "every child",
            "the small robot", "our captain", "a quiet river", "the baker", "that grey cat"]
    verb = ["watched", "followed", "painted", "remembered", "carried", "described",
            "found", "ignored", "admired", "questioned"]
    obj = ["the morning light", "a broken lantern", "seven green apples", "the distant hills",
           "an empty boat", "the long winter", "a letter from home", "the market square",
           "a forgotten song", "the northern road"]
    tail = ["before the rain began", "without saying a word", "while the town slept",
            "as the bells rang", "for the third time", "with great care",
            "under the tall trees", "after the storm", "in the late evening", "again"]
    out = []
    size = 0
    while size < nbytes:
        para = []
        for _ in range(r.randint(3, 6)):
            s = f"{r.choice(subj)} {r.choice(verb)} {r.choice(obj)} {r.choice(tail)}"
            if r.random() < 0.3:
                s += f", and {r.choice(subj)} {r.choice(verb)} {r.choice(obj)}"
            s = s[0].upper() + s[1:] + r.choice([".", ".", ".", "!", "?"])
            para.append(s)
        text = " ".join(para) + "\n\n"
        out.append(text)
        size += len(text)
    with open(path, "w") as f:
        f.write("".join(out))


# ---------------------------------------------------------------------------
# a / b / f / h: loss and gradients of one batch
# ---------------------------------------------------------------------------



def byte_corpus():
    """corpus() written to TMP/corpus.txt and prepared byte-level into TMP/data_byte: the data
    every oracle script starts from. Returns (text path, data directory)."""
    text = os.path.join(TMP, "corpus.txt")
    corpus(text)
    byte_dir = os.path.join(TMP, "data_byte")
    run(["prepare", "--input", text, "--out", byte_dir, "--tokenizer", "byte"])
    return text, byte_dir

def check_grad(case, fam, datadir, T=32, B=4, extra=()):
    out = os.path.join(TMP, f"{case}_init")
    run(["train", *fam.args, *extra, "--data", datadir, "--out", out, "--steps", "0",
         "--seed", "11", "--quiet=true", "--tensorboard=false", "--val-every", "0",
         "--threads", THREADS])
    ckpt = os.path.join(out, "step_00000000")
    shard = os.path.join(datadir, "train_000000.bin")
    gpath = os.path.join(TMP, f"{case}_grad.safetensors")
    stdout = run(["grad", "--checkpoint", ckpt, "--data", shard, "--seq-len", T,
                  "--batch-size", B, "--out", gpath, "--threads", THREADS])
    t_loss = float(json.loads(stdout.strip().splitlines()[-1])["loss"])
    grads = load_safetensors(gpath)

    params, cfg = fam.load_model(ckpt, dtype=DTYPE)
    x, y = windows(read_tokens(shard), T, range(B))
    loss = fam.loss(params, cfg, x, y)
    loss.backward()
    compare_grads(case, fam, params, cfg, loss.item(), t_loss, grads, gpath,
                  f"vocab {cfg.vocab_size}, {B}x{T} tokens")


def compare_grads(case, fam, params, cfg, ref_loss, t_loss, grads, gpath, desc):
    """Compares trellis's loss t_loss and gradients grads (from the file gpath) with the
    reference's (ref_loss, params[name].grad after backward); fails the case on any difference
    beyond TOL, a missing or unexpected tensor, or when nothing was compared. Returns ok."""
    ok = True
    e_loss = abs(t_loss - ref_loss) / abs(ref_loss)
    if not e_loss <= TOL:
        fail(f"{case}: loss trellis {t_loss!r} torch {ref_loss!r} (rel {e_loss:.3g})")
        ok = False
    missing = sorted(set(params) - set(grads))
    extra_t = sorted(set(grads) - set(params))
    if missing or extra_t:
        fail(f"{case}: gradient file {gpath}: missing {missing}, unexpected {extra_t}")
        ok = False
    worst, worst_name, n_cmp = 0.0, "", 0
    worst_zero = None  # largest |zero-gradient tensor's gradient| / |query bias gradient|
    for name, p in params.items():
        if name not in grads:
            continue
        g = p.grad.detach().numpy()
        if grads[name].shape != g.shape:
            fail(f"{case}: gradient {name} has shape {grads[name].shape}, torch {g.shape}")
            ok = False
            continue
        n_cmp += 1
        wz = whole_zero_grad(fam, name, cfg, g.shape)
        if wz is not None:
            # exact gradient zero: both sides must be rounding noise next to the query bias's
            ref_norm = float(np.linalg.norm(params[wz[0]].grad.detach().numpy()[wz[1]]))
            for side, arr in (("trellis", grads[name]), ("torch", g)):
                r = float(np.linalg.norm(arr.astype(np.float64))) / max(ref_norm, 1e-30)
                worst_zero = max(worst_zero or 0.0, r)
                if not r <= TOL:
                    fail(f"{case}: {side} gradient of {name} has norm {r:.3g} of {wz[0]}'s, "
                         f"but its exact value is zero")
                    ok = False
            continue
        e = rel(grads[name], g)
        if e > worst:
            worst, worst_name = e, name
        if not e <= TOL:
            fail(f"{case}: gradient {name} rel err {e:.3g} > {TOL}")
            ok = False
    if n_cmp == 0:
        fail(f"{case}: no gradient compared")
        ok = False
    zero_note = ("" if worst_zero is None else
                 f"; zero-gradient key bias: gradient norm <= {worst_zero:.1e} of the query bias's")
    print(f"{'PASS' if ok else 'FAIL'} {case}: {desc}: "
          f"loss {ref_loss:.6f} rel err {e_loss:.2e}; {n_cmp} gradients, worst rel err "
          f"{worst:.2e} ({worst_name}){zero_note}", flush=True)
    return ok


def hf_apply_rotary(x, theta):
    """HF's apply_rotary_pos_emb for positions 0..T-1, written out directly:
    emb = cat(freqs, freqs), x * cos(emb) + rotate_half(x) * sin(emb)."""
    T, hd = x.shape[-2], x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
    rotate_half = torch.cat((-x2, x1), dim=-1)
    return x * emb.cos() + rotate_half * emb.sin()


def check_rope(case, datadir):
    """Pins the reference's RoPE convention (pairing d with d + hd/2, angle pos * theta^(-2d/hd),
    positions from 0) to HF's formula at the llama-tiny checkpoint's head size and theta."""
    out = os.path.join(TMP, f"{case}_init")
    run(["train", *LLAMA.args, "--data", datadir, "--out", out, "--steps", "0", "--seed", "11",
         "--quiet=true", "--tensorboard=false", "--val-every", "0", "--threads", THREADS])
    _, cfg = LLAMA.load_model(os.path.join(out, "step_00000000"))
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, cfg.n_head, cfg.block_size, cfg.head_dim, generator=g,
                    dtype=torch.float64)
    want = hf_apply_rotary(x, cfg.theta)
    e64 = rel(torch_llama.rope(x, cfg.theta).numpy(), want.numpy())
    e32 = rel(torch_llama.rope(x.float(), cfg.theta).numpy(), want.numpy())
    # position 0 is the identity, and a rotation keeps every pair's length
    e0 = rel(torch_llama.rope(x, cfg.theta)[..., 0, :].numpy(), x[..., 0, :].numpy())
    ok = e64 <= 1e-12 and e32 <= 1e-6 and e0 <= 1e-15
    if not ok:
        fail(f"{case}: reference RoPE differs from HF apply_rotary_pos_emb: rel err "
             f"float64 {e64:.3g}, float32 {e32:.3g}, position 0 {e0:.3g}")
    print(f"{'PASS' if ok else 'FAIL'} {case}: head size {cfg.head_dim}, theta {cfg.theta:g}, "
          f"{cfg.block_size} positions: reference vs HF formula rel err {e64:.1e} (float64), "
          f"{e32:.1e} (float32)", flush=True)


# ---------------------------------------------------------------------------
# c / d / e / g / i: training steps
# ---------------------------------------------------------------------------


def expected_lr(step, steps, lr, min_lr, warmup):
    """The learning rate of 1-based step `step` of a `steps`-step run, as docs/training.md and `train --help`
    describe the schedule, written out here rather than read from trellis: linear warmup to lr
    over the first `warmup` steps (step s of them: lr * s / warmup), then cosine decay from lr to
    min_lr, reaching min_lr at the last step (progress (s - warmup) / (steps - warmup))."""
    if warmup > 0 and step <= warmup:
        return lr * step / warmup
    if steps <= warmup:
        return lr
    progress = min(1.0, (step - warmup) / (steps - warmup))
    return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


def read_metrics(path):
    steps = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            m = json.loads(line)
            if "loss" in m and "lr" in m:
                steps[int(m["step"])] = m
    return [steps[k] for k in sorted(steps)]


# Precondition of every training case (c, d, e, g, i): its float32 arithmetic must determine
# the result to well within TOL, which is not automatic. AdamW's first update of an element is
# lr * g / (|g| + eps), about lr * sign(g), and its sensitivity to a rounding error d in g is
# ~ d * eps / (|g| + eps)^2: an element whose gradient lies within float32 rounding of zero or
# of the eps scale (eps = 1e-8; after clipping, query/key weight gradients at initialisation are
# only ~1e-5) gets an update whose size or sign is set by rounding noise, up to ~lr, and later
# steps carry it along. llama-tiny from --seed 5 has such an element (layer 0 v_proj.weight,
# clipped gradient 1.3e-8 in a tensor whose largest is 1.3e-2): PyTorch float32 and float64
# alone then differ by ~4e-4 after 10 steps, so a check at TOL would compare noise. Tiny
# gradient elements as such are common and mostly harmless (in every seed tried some element,
# mostly in lm_head, is below 1e-5 of its tensor's largest, well-conditioned seeds included),
# and how much rounding each carries is not known ahead of time, so a fixed |g| / max|g|
# threshold does not separate good inputs from bad ones; measuring does. Each training case
# runs the reference twice, in float32 and in float64, on the same inputs and learning rates,
# and requires the two to agree within COND_TOL on every quantity compared with trellis
# (losses, gradient norms, final parameters, optimizer tensors): the reference's own rounding
# may use at most half the tolerance, leaving at least half for trellis's own rounding. A case
# failing this is reported as ill-conditioned inputs, naming the element whose step-1 update
# float32 does not determine, not as a trellis error; choose other inputs then. For the llama
# case as configured about one init seed in five passes (the median float32-vs-float64
# difference over seeds 1..120 is ~1e-5); case g's seed, 36 (1.7e-6), is one of them, selected
# by this check, which is why the check is part of the test.
COND_TOL = TOL / 2


class RefRun:
    """The reference model and torch optimizer of a training case in one dtype."""

    def __init__(self, fam, ckpt, dtype, optimizer, lr, wd, beta1, beta2, eps, momentum):
        self.params, self.cfg = fam.load_model(ckpt, dtype=dtype)
        self.dtype, self.fam = dtype, fam
        self.plist = list(self.params.values())
        ps = self.params.values()
        groups = [{"params": [p for p in ps if p.dim() == 2], "weight_decay": wd},
                  {"params": [p for p in ps if p.dim() != 2], "weight_decay": 0.0}]
        if optimizer == "adamw":
            self.opt = torch.optim.AdamW(groups, lr=lr, betas=(beta1, beta2), eps=eps)
        else:
            self.opt = torch.optim.SGD(groups, lr=lr, momentum=momentum, dampening=0.0,
                                       nesterov=False)

    def step(self, x, y, lr, clip):
        """One optimizer step at learning rate lr: (loss, pre-clip gradient norm, clipped
        gradients as float64 numpy arrays)."""
        self.opt.zero_grad(set_to_none=True)
        loss = self.fam.loss(self.params, self.cfg, x, y)
        loss.backward()
        if clip > 0:
            norm = float(torch.nn.utils.clip_grad_norm_(self.plist, clip))
        else:
            norm = float(torch.sqrt(sum((p.grad.double() ** 2).sum() for p in self.plist)))
        grads = {n: p.grad.detach().double().numpy().copy() for n, p in self.params.items()}
        for g in self.opt.param_groups:
            g["lr"] = lr
        self.opt.step()
        return loss.item(), norm, grads

    def compared(self, name):
        """{label: float64 array} of what the test compares for parameter `name` (see
        check_train): the parameter without a zero-gradient part, and its optimizer tensors
        unless its whole gradient is exactly zero."""
        p = self.params[name]
        out = {}
        z = self.fam.zero_grad(name, self.cfg)
        arr = p.detach().double().numpy()
        if z is None:
            out[name] = arr
        else:
            keep = np.ones(arr.shape, dtype=bool)
            keep[z[0]] = False
            if keep.any():
                out[name + z[3]] = arr[keep]
        if whole_zero_grad(self.fam, name, self.cfg, tuple(p.shape)) is None:
            for key, val in self.opt.state[p].items():
                if torch.is_tensor(val) and val.dim() > 0:
                    out[f"{key}.{name}"] = val.detach().double().numpy()
        return out


def step1_culprit(fam, cfg, a, b, grads):
    """The element whose step-1 update differs most between the float32 and float64 references
    (a, b: RefRun after step 1, same start), relative to its tensor's norm, with its float64
    clipped step-1 gradient and the tensor's largest: a description."""
    best = None
    for name, pa in a.params.items():
        da = pa.detach().double().numpy() - b.params[name].detach().double().numpy()
        g = grads[name]
        z = fam.zero_grad(name, cfg)
        if z is not None:
            da = da.copy()
            da[z[0]] = 0.0  # the zero-gradient part is checked separately
        norm = float(np.linalg.norm(b.params[name].detach().double().numpy()))
        r = float(np.linalg.norm(da)) / max(norm, 1e-30)
        if best is None or r > best[0]:
            i = np.unravel_index(int(np.argmax(np.abs(da))), da.shape)
            best = (r, name, i, float(abs(g[i])), float(np.abs(g).max()))
    r, name, i, gi, gmax = best
    return (f"after step 1 the references already differ by {r:.2g} in {name}, most at "
            f"element {list(map(int, i))} whose clipped step-1 gradient is {gi:.2g} "
            f"(tensor max {gmax:.2g})")


def check_train(case, fam, datadir, steps, G, T, micro=0, optimizer="adamw", seed=5,
                lr=1e-2, min_lr=1e-3, warmup=2, wd=0.1, clip=1.0, beta1=0.9, beta2=0.95,
                eps=1e-8, momentum=0.9, batches=None):
    """batches(s) -> (x, y), what fam.loss takes for 0-based step s: by default the windows of
    datadir's train shards that trellis trains on without shuffling (s * G + j, wrapping)."""
    common = [*fam.args, "--data", datadir, "--batch-size", G, "--micro-batch-size", micro,
              "--seq-len", T, "--seed", seed, "--shuffle=false", "--lr", lr, "--min-lr", min_lr,
              "--warmup-steps", warmup, "--weight-decay", wd, "--grad-clip", clip,
              "--beta1", beta1, "--beta2", beta2, "--eps", eps, "--optimizer", optimizer,
              "--momentum", momentum, "--val-every", "0", "--quiet=true", "--tensorboard=false",
              "--threads", THREADS, "--precision", "fp32"]
    init = os.path.join(TMP, f"{case}_init")
    out = os.path.join(TMP, f"{case}_train")
    run(["train", *common, "--out", init, "--steps", "0"])
    run(["train", *common, "--out", out, "--steps", steps])
    metrics = read_metrics(os.path.join(out, "metrics.jsonl"))
    final_dir = os.path.join(out, f"step_{steps:08d}")

    ok = True
    if len(metrics) != steps:
        fail(f"{case}: metrics.jsonl has {len(metrics)} training steps, expected {steps}")
        return

    # the reference (DTYPE) and its twin in the other precision, for the precondition
    ckpt = os.path.join(init, "step_00000000")
    hyper = (optimizer, lr, wd, beta1, beta2, eps, momentum)
    ref = RefRun(fam, ckpt, DTYPE, *hyper)
    twin = RefRun(fam, ckpt, torch.float32 if DTYPE == torch.float64 else torch.float64, *hyper)
    params, cfg, opt, names = ref.params, ref.cfg, ref.opt, list(ref.params)

    if batches is None:
        tokens = read_split(datadir, "train")
        W = (tokens.size - 1) // T

        def batches(s):
            return windows(tokens, T, [(s * G + j) % W for j in range(G)])

    # The learning rates: the schedule computed here (not trellis's logged lr) drives the
    # reference, and trellis's logged lr must match it (trellis keeps it in float32: 1e-6).
    lrs = [expected_lr(s + 1, steps, lr, min_lr, warmup) for s in range(steps)]
    worst_lr = 0.0
    for s, want in enumerate(lrs):
        e = abs(float(metrics[s]["lr"]) - want) / want
        worst_lr = max(worst_lr, e)
        if not e <= 1e-6:
            fail(f"{case}: step {s + 1}: learning rate trellis {metrics[s]['lr']!r}, schedule "
                 f"{want!r} (warmup {warmup}, cosine from {lr} to {min_lr} over {steps} steps)")
            ok = False

    worst_loss = worst_norm = 0.0
    cond, cond_name = 0.0, ""  # worst float32-vs-float64 difference of the reference
    culprit = ""
    clipped = 0
    for s in range(steps):
        m = metrics[s]
        x, y = batches(s)
        loss, norm, grads = ref.step(x, y, lrs[s], clip)
        t_loss, t_norm, t_grads = twin.step(x, y, lrs[s], clip)
        if s == 0:
            culprit = step1_culprit(fam, cfg, ref, twin,
                                    grads if ref.dtype == torch.float64 else t_grads)
        for label, a, b in ((f"loss at step {s + 1}", loss, t_loss),
                            (f"grad_norm at step {s + 1}", norm, t_norm)):
            e = abs(a - b) / abs(b)
            if e > cond:
                cond, cond_name = e, label
        if norm > clip > 0:
            clipped += 1

        e = abs(m["loss"] - loss) / abs(loss)
        worst_loss = max(worst_loss, e)
        if not e <= TOL:
            fail(f"{case}: step {s + 1}: loss trellis {m['loss']!r} torch {loss!r} "
                 f"(rel {e:.3g})")
            ok = False
        if "grad_norm" in m:
            e = abs(m["grad_norm"] - norm) / norm
            worst_norm = max(worst_norm, e)
            if not e <= TOL:
                fail(f"{case}: step {s + 1}: grad_norm trellis {m['grad_norm']!r} torch {norm!r} "
                     f"(rel {e:.3g})")
                ok = False
    if clip > 0 and optimizer == "adamw" and clipped == 0:
        fail(f"{case}: gradient clipping at {clip} never triggered; the test needs it to")
        ok = False
    t_clipped = sum(1 for m in metrics if m.get("grad_norm", 0.0) > clip) if clip > 0 else 0

    # precondition: the reference reproduces itself across precisions (see COND_TOL)
    for name in names:
        a, b = ref.compared(name), twin.compared(name)
        for label in a:
            e = rel(a[label], b[label])
            if e > cond:
                cond, cond_name = e, label
    if not cond <= COND_TOL:
        fail(f"{case}: ill-conditioned inputs (precondition, not a trellis result): the "
             f"reference in float32 and in float64 differs by {cond:.3g} > {COND_TOL:g} (TOL/2) "
             f"on {cond_name} after {steps} steps, so a comparison at {TOL:g} would measure "
             f"rounding noise; {culprit}; choose other inputs (seed, batch)")
        ok = False

    final = checkpoint_tensors(final_dir)
    init_arrays = checkpoint_tensors(os.path.join(init, "step_00000000"))
    worst_p, worst_pn, n_p = 0.0, "", 0
    worst_k = None  # largest key-bias drift / query-bias drift (None: no key bias)
    for name, p in params.items():
        if name not in final:
            fail(f"{case}: final checkpoint lacks {name}")
            ok = False
            continue
        ref = p.detach().numpy()
        got = final[name]
        if got.shape != ref.shape:
            fail(f"{case}: after step {steps}: parameter {name} has shape {got.shape}, "
                 f"torch {ref.shape}")
            ok = False
            continue
        z = fam.zero_grad(name, cfg)
        if z is not None:
            # A key bias has an exactly zero gradient (softmax is invariant to adding q.b_k
            # to every score of a row), so both sides only see rounding noise (~1e-11)
            # there, which AdamW's m/(sqrt(v)+eps) blows up to noise-driven updates of
            # ~1e-3 lr. Its value is not reproducible between two correct fp32
            # implementations; its exact value is its initial value. Check the rest of the
            # tensor at TOL and that the key bias barely moved on both sides (a wrong
            # key-bias gradient would move it as far as the query bias).
            zidx, qname, qidx, label = z
            k0 = init_arrays[name][zidx].astype(np.float64)
            q_move = np.linalg.norm(params[qname].detach().numpy()[qidx].astype(np.float64)
                                    - init_arrays[qname][qidx])
            for side, arr in (("trellis", got), ("torch", ref)):
                moved = np.linalg.norm(arr[zidx] - k0)
                worst_k = max(worst_k or 0.0, moved / max(q_move, 1e-30))
                if not moved <= 1e-2 * q_move:
                    fail(f"{case}: after step {steps}: {side} {name}[key part] moved "
                         f"{moved:.3g}, but it has a zero gradient (query bias moved "
                         f"{q_move:.3g})")
                    ok = False
            keep = np.ones(ref.shape, dtype=bool)
            keep[zidx] = False
            if not keep.any():
                continue
            ref, got = ref[keep], got[keep]
            name = name + label
        n_p += 1
        e = rel(got, ref)
        if e > worst_p:
            worst_p, worst_pn = e, name
        if not e <= TOL:
            fail(f"{case}: after step {steps}: parameter {name} rel err {e:.3g} > {TOL}")
            ok = False
    if n_p == 0:
        fail(f"{case}: no final parameter compared")
        ok = False

    # optimizer state: trellis names it like torch (exp_avg.<name>, ...); every state tensor torch
    # has must be in the checkpoint and match, and at least one must be compared
    worst_o, worst_on, n_state, n_want = 0.0, "", 0, 0
    ostate = checkpoint_optimizer(final_dir)
    if not ostate:
        fail(f"{case}: the final checkpoint has no optimizer state ({final_dir})")
        ok = False
    else:
        missing = []
        for name, p in params.items():
            wz = whole_zero_grad(fam, name, cfg, tuple(p.shape))
            for key, val in opt.state[p].items():
                if not torch.is_tensor(val) or val.dim() == 0:
                    continue
                tname = f"{key}.{name}"
                n_want += 1
                if tname not in ostate:
                    missing.append(tname)
                    continue
                if ostate[tname].shape != tuple(val.shape):
                    fail(f"{case}: optimizer state {tname} has shape {ostate[tname].shape}, "
                         f"torch {tuple(val.shape)}")
                    ok = False
                    continue
                n_state += 1
                if wz is not None:
                    # moments of rounding noise: zero next to the query bias's on both sides
                    qval = opt.state[params[wz[0]]][key].detach().numpy()[wz[1]]
                    q_norm = float(np.linalg.norm(qval.astype(np.float64)))
                    for side, arr in (("trellis", ostate[tname]), ("torch", val.numpy())):
                        r = float(np.linalg.norm(arr.astype(np.float64))) / max(q_norm, 1e-30)
                        if not r <= TOL:
                            fail(f"{case}: after step {steps}: {side} {tname} has norm {r:.3g} "
                                 f"of {key}.{wz[0]}'s, but its gradient is exactly zero")
                            ok = False
                    continue
                e = rel(ostate[tname], val.detach().numpy())
                if e > worst_o:
                    worst_o, worst_on = e, tname
                if not e <= TOL:
                    fail(f"{case}: after step {steps}: optimizer state {tname} rel err {e:.3g}")
                    ok = False
        if missing:
            fail(f"{case}: {opath} lacks {len(missing)} of the {n_want} optimizer tensors torch "
                 f"has: {missing[:5]}{' ...' if len(missing) > 5 else ''}")
            ok = False
    if n_state == 0 or n_state != n_want:
        fail(f"{case}: {n_state} optimizer tensors compared of the {n_want} torch has ({opath})")
        ok = False

    desc = f"{optimizer}, {steps} steps of {G}x{T}" + (f" (micro-batch {micro})" if micro else "")
    print(f"{'PASS' if ok else 'FAIL'} {case}: {desc}, clip triggered {t_clipped}/{steps}: "
          f"lr vs schedule {worst_lr:.1e}; "
          f"worst loss rel err {worst_loss:.2e}, grad_norm {worst_norm:.2e}; {n_p} final "
          f"parameters, worst rel err {worst_p:.2e} ({worst_pn}), "
          f"{'no key bias' if worst_k is None else f'key-bias drift/query-bias drift {worst_k:.1e}'}"
          f"; {n_state} optimizer tensors, worst "
          f"{worst_o:.2e} ({worst_on}); reference float32 vs float64 {cond:.1e} ({cond_name})",
          flush=True)


def setup(name, fresh=False):
    """Points this module's BIN and TMP (TRELLIS_TMP/name; emptied if fresh), which run,
    compare_grads and check_train read, at ctest's environment and seeds torch. Returns
    TRELLIS_SOURCE, or None (after an error line) when the environment is not set."""
    global BIN, TMP
    BIN = os.environ.get("TRELLIS_BIN")
    tmp = os.environ.get("TRELLIS_TMP")
    src = os.environ.get("TRELLIS_SOURCE")
    if not BIN or not tmp or not src:
        print("error: set TRELLIS_BIN, TRELLIS_TMP and TRELLIS_SOURCE", file=sys.stderr)
        return None
    TMP = os.path.join(tmp, name)
    if fresh:
        shutil.rmtree(TMP, ignore_errors=True)
    os.makedirs(TMP, exist_ok=True)
    torch.set_num_threads(int(THREADS))
    torch.manual_seed(0)
    return src


def main():
    src = setup("torch_oracle")
    if src is None:
        return 2
    t0 = time.time()

    text, byte_dir = byte_corpus()
    bpe_dir = os.path.join(TMP, "data_gpt2")
    run(["prepare", "--input", text, "--out", bpe_dir, "--tokenizer", "gpt2",
         "--tokenizer-dir", os.path.join(src, "tests", "data", "gpt2")])

    cases = [
        ("a", lambda: check_grad("a (byte grad)", GPT2, byte_dir)),
        ("b", lambda: check_grad("b (gpt2 bpe grad)", GPT2, bpe_dir)),
        ("c", lambda: check_train("c (adamw)", GPT2, byte_dir, 10, 4, 32)),
        ("d", lambda: check_train("d (adamw, accumulation)", GPT2, byte_dir, 10, 4, 32,
                                  micro=2)),
        ("e", lambda: check_train("e (sgd momentum)", GPT2, byte_dir, 10, 8, 64,
                                  optimizer="sgd", lr=0.05, min_lr=0.005, warmup=0, clip=1.5)),
        ("f", lambda: (check_rope("f (llama rope)", byte_dir),
                       check_grad("f (llama gqa byte grad)", LLAMA, byte_dir))),
        ("g", lambda: check_train("g (llama adamw)", LLAMA, byte_dir, 10, 4, 32, seed=36)),
        ("h", lambda: check_grad("h (encoder byte grad)", ENCODER, byte_dir)),
        ("i", lambda: check_train("i (encoder adamw)", ENCODER, byte_dir, 10, 4, 32)),
    ]
    return run_cases(cases, "torch oracle", t0)


def run_cases(cases, title, t0):
    """Runs the (key, fn) cases named on the command line (default: all) and prints the summary;
    returns the exit status. A crash in one case does not hide the others."""
    only = set(sys.argv[1:])
    unknown = sorted(only - {key for key, _ in cases})
    if unknown:
        fail(f"unknown case(s) {unknown}")
    ran = 0
    for key, fn in cases:
        if only and key not in only:
            continue
        ran += 1
        try:
            fn()
        except Exception as ex:  # a crash in one case should not hide the others
            fail(f"case {key}: {type(ex).__name__}: {ex}")
    if ran == 0:
        fail("no case ran")
    print(f"{title} ({str(DTYPE).replace('torch.', '')} reference): "
          f"{'all checks passed' if not failures else f'{len(failures)} failure(s)'} "
          f"in {time.time() - t0:.1f}s", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
