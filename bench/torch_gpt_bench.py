#!/usr/bin/env python3
"""PyTorch-eager GPT-2 training-step timing, the baseline trellis is compared with.

The model is tests/reference/torch_gpt.py's GPT-2 (pre-LN, tanh GELU, tied head,
no dropout), float32 on the CPU, trained with torch.optim.AdamW (weight decay on 2-D
weights only) and gradient-norm clipping at 1.0, like `trellis train`'s defaults.

Presets (same shapes as trellis' presets):
  baby: 6 layers, 6 heads, width 384, context 256, vocab 256
  gpt2: 12 layers, 12 heads, width 768, context 1024, vocab 50257
The trellis side of a comparison must use the same vocab: trellis' default baby data
is its built-in byte-level corpus (vocab 256); for gpt2 give trellis a data directory
prepared with the GPT-2 tokenizer (vocab 50257), see bench/run_bench.py.

Prints one JSON line: median ms/step and tokens/s over the steps after 2 warm-up steps
(--steps counts all steps, warm-ups included).

  /usr/bin/python3 bench/torch_gpt_bench.py --preset baby --batch 8 --seq 256 --steps 10 --threads 2
"""

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import torch  # noqa: E402

from reference.torch_gpt import GPTConfig, gpt_loss, random_model  # noqa: E402

PRESETS = {
    "baby": dict(n_layer=6, n_head=6, n_embd=384, block_size=256, vocab_size=256),
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50257),
}
WARMUP = 2


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="baby")
    ap.add_argument("--batch", type=int, default=8, help="sequences per step")
    ap.add_argument("--seq", type=int, default=256, help="tokens per sequence")
    ap.add_argument("--steps", type=int, default=10, help="steps, the 2 warm-ups included")
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    ap.add_argument("--vocab", type=int, default=0, help="override the preset's vocab")
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.steps <= WARMUP:
        ap.error(f"--steps must exceed the {WARMUP} warm-up steps")

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    p = dict(PRESETS[a.preset])
    if a.vocab:
        p["vocab_size"] = a.vocab
    cfg = GPTConfig(**p)
    if a.seq > cfg.block_size:
        ap.error(f"--seq {a.seq} exceeds the context length {cfg.block_size}")
    params = random_model(cfg, seed=a.seed)
    plist = list(params.values())
    n_params = sum(t.numel() for t in plist)
    opt = torch.optim.AdamW(
        [{"params": [t for t in plist if t.dim() == 2], "weight_decay": 0.1},
         {"params": [t for t in plist if t.dim() != 2], "weight_decay": 0.0}],
        lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    g = torch.Generator().manual_seed(a.seed + 1)
    data = torch.randint(0, cfg.vocab_size, (a.steps, a.batch, a.seq + 1), generator=g)

    times, losses = [], []
    for s in range(a.steps):
        x, y = data[s, :, :-1], data[s, :, 1:]
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = gpt_loss(params, cfg, x, y)
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
        "n_layer": cfg.n_layer, "n_head": cfg.n_head, "n_embd": cfg.n_embd,
        "vocab_size": cfg.vocab_size, "params": n_params,
        "batch": a.batch, "seq": a.seq, "threads": a.threads,
        "steps_timed": a.steps - WARMUP,
        "ms_per_step": round(ms, 3),
        "tokens_per_s": round(a.batch * a.seq / (ms / 1e3), 1),
        "first_loss": round(losses[0], 4),
    }), flush=True)


if __name__ == "__main__":
    main()
