#!/usr/bin/env python3
"""PyTorch DDP (gloo over 127.0.0.1) data-parallel scaling: the peer of trellis' --dp scaling.

The model is tests/reference/torch_gpt.py's GPT-2 (`baby`: 6 layers, 6 heads, width 384,
context 256, vocab 256), float32 on the CPU, wrapped in an nn.Module so that
torch.nn.parallel.DistributedDataParallel (default 25 MiB buckets, all-reduce overlapped with
backward) can manage it. AdamW (weight decay on 2-D weights only) and gradient-norm clipping at
1.0, like `trellis train`'s defaults. One thread per process (torch.set_num_threads(1)).

A fixed global batch (default 8 x 256 tokens) is split across the world: each of W ranks trains
on batch/W sequences per step. World sizes are launched with torch.multiprocessing.spawn, one
after another, and the whole sequence is repeated --repeats times (1, 2, 1, 2, ...) so that load
from other jobs on the machine hits every world size alike. A run's time is rank 0's median
ms/step after 2 warm-up steps (DDP's all-reduce makes every step wait for the slowest rank); over
repeats, the median of the per-run medians is reported.

Scaling efficiency at a fixed global batch: eff(W) = t(1) / (W * t(W)); 1.0 = perfect.

Prints one JSON line per run, then a summary JSON line ("summary": true) with t_ms per world and
efficiency per world:

  /usr/bin/python3 bench/torch_ddp_bench.py --steps 12 --repeats 2 [--worlds 1,2]
"""

import argparse
import json
import os
import socket
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from reference.torch_gpt import GPTConfig, gpt_loss, random_model  # noqa: E402

BABY = dict(n_layer=6, n_head=6, n_embd=384, block_size=256, vocab_size=256)
WARMUP = 2


class FunctionalGPT(torch.nn.Module):
    """Holds torch_gpt's parameter dict as nn.Parameters (DDP needs a Module)."""

    def __init__(self, params, cfg):
        super().__init__()
        self.cfg = cfg
        self.names = list(params)
        for i, name in enumerate(self.names):
            self.register_parameter(f"p{i}", torch.nn.Parameter(params[name].detach().clone()))

    def forward(self, idx, targets):
        params = {name: getattr(self, f"p{i}") for i, name in enumerate(self.names)}
        return gpt_loss(params, self.cfg, idx, targets)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, world, port, a, queue):
    torch.set_num_threads(a.threads)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        cfg = GPTConfig(**BABY)
        model = FunctionalGPT(random_model(cfg, seed=a.seed), cfg)  # same init on every rank
        ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=a.bucket_mb)
        plist = list(model.parameters())
        opt = torch.optim.AdamW(
            [{"params": [t for t in plist if t.dim() == 2], "weight_decay": 0.1},
             {"params": [t for t in plist if t.dim() != 2], "weight_decay": 0.0}],
            lr=6e-4, betas=(0.9, 0.95), eps=1e-8)
        per_rank = a.batch // world
        g = torch.Generator().manual_seed(a.seed + 1)
        data = torch.randint(0, cfg.vocab_size, (a.steps, a.batch, a.seq + 1), generator=g)
        times = []
        for s in range(a.steps):
            chunk = data[s, rank * per_rank:(rank + 1) * per_rank]
            x, y = chunk[:, :-1], chunk[:, 1:]
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = ddp(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(plist, 1.0)
            opt.step()
            times.append((time.perf_counter() - t0) * 1e3)
        if rank == 0:
            queue.put({"world": world, "ms": statistics.median(times[WARMUP:]),
                       "loss": float(loss.detach())})
    finally:
        dist.destroy_process_group()


def run_world(world, a):
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(worker, args=(world, free_port(), a, queue), nprocs=world, join=True,
                       start_method="spawn")
    return queue.get()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", default="1,2", help="comma-separated world sizes")
    ap.add_argument("--batch", type=int, default=8, help="global batch in sequences")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=12, help="steps per run, 2 warm-ups included")
    ap.add_argument("--repeats", type=int, default=2, help="runs per world size (alternated)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process")
    ap.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket_cap_mb")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    worlds = [int(w) for w in a.worlds.split(",")]
    if a.steps <= WARMUP:
        ap.error(f"--steps must exceed the {WARMUP} warm-up steps")
    for w in worlds:
        if a.batch % w:
            ap.error(f"--batch {a.batch} does not split over world {w}")

    per_world = {w: [] for w in worlds}
    for _ in range(a.repeats):
        for w in worlds:
            r = run_world(w, a)
            per_world[w].append(r["ms"])
            print(json.dumps(r), flush=True)
    t = {w: statistics.median(v) for w, v in per_world.items()}
    summary = {"summary": True, "t_ms": {str(w): t[w] for w in worlds}}
    if 1 in t:
        summary["efficiency"] = {str(w): t[1] / (w * t[w]) for w in worlds}
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
