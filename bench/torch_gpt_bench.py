#!/usr/bin/env python3
"""PyTorch-eager GPT-2 training-step timing, the baseline trellis is compared with.

The model is a GPT-2 written here as a PyTorch user would write it (nn.Linear, nn.LayerNorm,
nn.Embedding; pre-LN, tanh GELU, head tied to the token embedding, no dropout, GPT-2 init:
N(0, 0.02), residual projections N(0, 0.02/sqrt(2L))), independent of trellis and of
tests/reference; given the same weights it computes the loss and gradients of
tests/reference/torch_gpt.py's model (trellis' architecture) to fp32 rounding. Trained with
torch.optim.AdamW (weight decay 0.1 on 2-D weights only, betas 0.9/0.95) and gradient-norm
clipping at 1.0, like `trellis train`'s defaults.

--precision fp32: everything in float32. --precision bf16: PyTorch's CPU mixed precision as
documented (torch.cpu.amp.autocast(dtype=torch.bfloat16) around forward and loss, backward
outside it; the parameters, their gradients and AdamW's state stay float32, no grad scaler).

Presets (same shapes as trellis' presets):
  baby: 6 layers, 6 heads, width 384, context 256, vocab 256
  gpt2: 12 layers, 12 heads, width 768, context 1024, vocab 50257
The trellis side of a comparison must use the same vocab: trellis' default baby data
is its built-in byte-level corpus (vocab 256); for gpt2 give trellis a data directory
prepared with the GPT-2 tokenizer (vocab 50257), see bench/run_bench.py.

Threads: --threads sets torch.set_num_threads. OpenMP's and OpenBLAS's own pools read
OMP_NUM_THREADS / OPENBLAS_NUM_THREADS (and OPENBLAS_CORETYPE) when torch is imported, so
those must be set in the environment of this process; bench/run_bench.py does that, together
with MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=4294967295 (glibc malloc keeps freed
activations instead of mapping and zeroing fresh pages every step).

Prints one JSON line: median ms/step and tokens/s over the steps after 2 warm-up steps
(--steps counts all steps, warm-ups included), and the setup the process really ran with
(torch threads, the BLAS library torch loaded, OpenBLAS's core type, the environment).
--blas-info prints only the BLAS part and exits ("reference": true means netlib's reference
BLAS, which Debian's python3-torch uses until libopenblas0-pthread is installed; see
bench/setup_peer.sh).

  OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=1 MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=4294967295 \\
    /usr/bin/python3 bench/torch_gpt_bench.py --preset baby --batch 8 --seq 256 --steps 10 \\
    --threads 2 --precision bf16
  /usr/bin/python3 bench/torch_gpt_bench.py --blas-info
"""

import argparse
import contextlib
import ctypes
import json
import math
import os
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

PRESETS = {
    "baby": dict(n_layer=6, n_head=6, n_embd=384, block_size=256, vocab_size=256),
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50257),
}
WARMUP = 2
ENV_KEYS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE", "MALLOC_MMAP_MAX_",
            "MALLOC_TRIM_THRESHOLD_")


# ---------------------------------------------------------------------------
# model
# ---------------------------------------------------------------------------


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, block_size):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        mask = torch.ones(block_size, block_size, dtype=torch.bool).tril()
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        hs = C // self.n_head
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(~self.mask[:T, :T], float("-inf"))
        att = torch.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, block_size):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, eps=1e-5)
        self.attn = CausalSelfAttention(n_embd, n_head, block_size)
        self.ln_2 = nn.LayerNorm(n_embd, eps=1e-5)
        self.mlp = MLP(n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, n_layer, n_head, n_embd, block_size, vocab_size):
        super().__init__()
        assert n_embd % n_head == 0
        self.block_size = block_size
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList(Block(n_embd, n_head, block_size) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd, eps=1e-5)
        # GPT-2 init; the head is wte itself (tied), so it has no parameters of its own.
        for name, p in self.named_parameters():
            if name.endswith(".bias"):
                nn.init.zeros_(p)
            elif ".ln_" in name or name.startswith("ln_"):
                nn.init.ones_(p)
            else:
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith("c_proj.weight") else 0.02
                nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, idx, targets):
        """idx, targets [B,T] int64 -> mean cross-entropy over all B*T targets."""
        B, T = idx.shape
        if T > self.block_size:
            raise ValueError(f"sequence length {T} exceeds block size {self.block_size}")
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.h:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


# ---------------------------------------------------------------------------
# what the process runs on
# ---------------------------------------------------------------------------


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def blas_info():
    """The BLAS this process (torch imported) runs on: the library whose sgemm_ libtorch_cpu's
    dependencies resolve to (dlsym through libtorch_cpu's handle, then dladdr), whether that is
    netlib's reference BLAS (Debian's libblas3, .../blas/libblas.so.3), the BLAS-like libraries
    mapped, and OpenBLAS's config, core type and thread count when it is loaded."""
    mapped = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].strip() not in mapped:
                mapped.append(parts[5].strip())
    sgemm = None
    torch_cpu = [p for p in mapped if os.path.basename(p).startswith("libtorch_cpu.so")]
    if torch_cpu:
        try:
            addr = ctypes.cast(ctypes.CDLL(torch_cpu[0]).sgemm_, ctypes.c_void_p).value
            dl = _DlInfo()
            if ctypes.CDLL(None).dladdr(ctypes.c_void_p(addr), ctypes.byref(dl)) and dl.dli_fname:
                sgemm = os.path.realpath(dl.dli_fname.decode())
        except (OSError, AttributeError):
            pass  # no sgemm_ among its dependencies: a BLAS linked into torch itself (MKL)
    libs = [os.path.realpath(p) for p in mapped if os.path.basename(p).startswith(
        ("libblas.so", "libopenblas", "libblis", "libmkl_rt"))]
    info = {"sgemm_from": sgemm, "reference": False, "blas_libs": libs,
            "openblas_config": None, "openblas_core": None, "openblas_threads": None}
    if sgemm is not None:
        info["reference"] = os.path.basename(os.path.dirname(sgemm)) == "blas"
    else:  # cannot tell where sgemm_ binds: reference if it is the only BLAS mapped
        info["reference"] = bool(libs) and all(
            os.path.basename(os.path.dirname(p)) == "blas" for p in libs)
    for p in libs:
        if "openblas" in p:
            try:
                lib = ctypes.CDLL(p)
                for key, fn in (("openblas_config", "openblas_get_config"),
                                ("openblas_core", "openblas_get_corename")):
                    f = getattr(lib, fn)
                    f.restype = ctypes.c_char_p
                    info[key] = f().decode().strip()
                # The pool OpenBLAS really uses: what OPENBLAS_NUM_THREADS set at load time,
                # unless something called openblas_set_num_threads since.
                info["openblas_threads"] = int(lib.openblas_get_num_threads())
            except (OSError, AttributeError):
                pass
            break
    return info


# ---------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="baby")
    ap.add_argument("--batch", type=int, default=8, help="sequences per step")
    ap.add_argument("--seq", type=int, default=256, help="tokens per sequence")
    ap.add_argument("--steps", type=int, default=10, help="steps, the 2 warm-ups included")
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                    help="bf16: forward and loss under torch.cpu.amp.autocast(bfloat16)")
    ap.add_argument("--vocab", type=int, default=0, help="override the preset's vocab")
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--blas-info", action="store_true",
                    help="print the BLAS torch loaded as JSON and exit")
    a = ap.parse_args()
    if a.blas_info:
        print(json.dumps(dict(blas_info(), torch=torch.__version__)), flush=True)
        return
    if a.steps <= WARMUP:
        ap.error(f"--steps must exceed the {WARMUP} warm-up steps")

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    p = dict(PRESETS[a.preset])
    if a.vocab:
        p["vocab_size"] = a.vocab
    if a.seq > p["block_size"]:
        ap.error(f"--seq {a.seq} exceeds the context length {p['block_size']}")
    model = GPT(**p)
    plist = list(model.parameters())  # wte once: the head is tied to it
    n_params = sum(t.numel() for t in plist)
    opt = torch.optim.AdamW(
        [{"params": [t for t in plist if t.dim() == 2], "weight_decay": 0.1},
         {"params": [t for t in plist if t.dim() != 2], "weight_decay": 0.0}],
        lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    g = torch.Generator().manual_seed(a.seed + 1)
    data = torch.randint(0, p["vocab_size"], (a.steps, a.batch, a.seq + 1), generator=g)
    if a.precision == "bf16":
        autocast = lambda: torch.cpu.amp.autocast(dtype=torch.bfloat16)  # noqa: E731
    else:
        autocast = contextlib.nullcontext

    times, losses = [], []
    for s in range(a.steps):
        x, y = data[s, :, :-1], data[s, :, 1:]
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with autocast():
            loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(plist, 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())

    ms = statistics.median(times[WARMUP:]) * 1e3
    print(json.dumps({
        "impl": "torch-eager",
        "torch": torch.__version__,
        "preset": a.preset,
        "n_layer": p["n_layer"], "n_head": p["n_head"], "n_embd": p["n_embd"],
        "vocab_size": p["vocab_size"], "params": n_params,
        "batch": a.batch, "seq": a.seq, "threads": a.threads,
        "torch_threads": torch.get_num_threads(),
        "precision": a.precision,
        "steps_timed": a.steps - WARMUP,
        "ms_per_step": round(ms, 3),
        "tokens_per_s": round(a.batch * a.seq / (ms / 1e3), 1),
        "first_loss": round(losses[0], 4),
        "last_loss": round(losses[-1], 4),
        **blas_info(),
        "env": {k: os.environ.get(k) for k in ENV_KEYS},
    }), flush=True)


if __name__ == "__main__":
    main()
