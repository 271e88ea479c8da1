"""Per-rank memory of a model across ZeRO stages and recompute policies (issue 12): for each
(zero, recompute) the `train --dry-run --json` prediction of the largest rank (parameters,
gradients, optimizer state, ZeRO shards, activations, workspace) next to what training measures
(alloc_peak_bytes_max: the largest rank's allocator high-water mark; peak_rss_bytes_max), the
predicted model states (what persists between steps) next to what the data-parallel sync and the
optimizer hold before the first step (mem_bytes_max), and the losses, so a run that only fits is
also seen to train.

usage: python3 bench/memory_bench.py TRELLIS_BIN DATA_DIR OUT [--model gpt2-medium] [--dp 2]
  [--zero 0,1,2,3] [--recompute none,selective,full] [--seq-len 512] [--batch-size 2] [--steps 2]
  [--precision fp32|bf16] [--grad-reduce-dtype fp32|bf16]
Prints a Markdown table; run it under `flock /tmp/bench.lock` on a quiet machine."""
import argparse
import json
import os
import shutil
import subprocess

p = argparse.ArgumentParser()
p.add_argument("trellis")
p.add_argument("data")
p.add_argument("out")
p.add_argument("--model", default="gpt2-medium")
p.add_argument("--dp", type=int, default=2)
p.add_argument("--zero", default="0,1,2,3")
p.add_argument("--recompute", default="none,selective,full")
p.add_argument("--seq-len", type=int, default=512)
p.add_argument("--batch-size", type=int, default=2)
p.add_argument("--steps", type=int, default=2)
p.add_argument("--precision", default="fp32")
p.add_argument("--grad-reduce-dtype", default="fp32")
a = p.parse_args()

env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
common = ["train", "--model", a.model, "--data", a.data, "--seq-len", str(a.seq_len),
          "--batch-size", str(a.batch_size), "--steps", str(a.steps), "--val-every", "0",
          "--val-batches", "0", "--threads", "1", "--quiet", "--tensorboard", "false",
          "--precision", a.precision, "--dp", str(a.dp),
          "--grad-reduce-dtype", a.grad_reduce_dtype]
mib = 1 << 20
print(f"load average before: {os.getloadavg()}")
print(f"{a.model}, dp {a.dp}, batch {a.batch_size} x {a.seq_len} tokens, {a.steps} steps, "
      f"{a.precision}, gradients reduced in {a.grad_reduce_dtype}, "
      "MiB of the largest rank\n")
print("| zero | recompute | params | grads | optimizer | shards | bf16 copies | buffers "
      "| activations | workspace | predicted | measured | error | peak RSS | model states "
      "| held before step 1 | losses | step s |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
for zero in a.zero.split(","):
    for policy in a.recompute.split(","):
        layout = ["--zero", zero, "--recompute", policy]
        dry = subprocess.run([a.trellis] + common + layout + ["--dry-run", "--json"], check=True,
                             env=env, capture_output=True, text=True)
        top = max(json.loads(dry.stdout), key=lambda r: r["total"])
        out = os.path.join(a.out, f"zero{zero}_{policy}")
        shutil.rmtree(out, ignore_errors=True)
        subprocess.run(["mpirun", "--oversubscribe", "-np", str(a.dp), a.trellis] + common + layout
                       + ["--out", out], check=True, env=env)
        with open(os.path.join(out, "metrics.jsonl")) as f:
            rows = [r for r in map(json.loads, f) if "loss" in r]
        measured = max(r["alloc_peak_bytes_max"] for r in rows)
        rss = max(r["peak_rss_bytes_max"] for r in rows)
        held = max(r["mem_bytes_max"] for r in rows)  # what the sync and optimizer hold at setup
        states = sum(top.get(k, 0) for k in ("params", "grads", "optimizer", "shards",
                                             "weight_copies"))
        step_s = sorted(r["step_ms"] for r in rows)[len(rows) // 2] / 1000
        cells = [top.get(k, 0) / mib for k in ("params", "grads", "optimizer", "shards",
                                               "weight_copies", "buffers", "activations",
                                               "workspace", "total")]
        losses = " → ".join(f"{r['loss']:.3f}" for r in (rows[0], rows[-1]))
        print(f"| {zero} | {policy} | " + " | ".join(f"{c:,.0f}" for c in cells) +
              f" | {measured / mib:,.0f} | {100 * (measured / top['total'] - 1):+.1f}% "
              f"| {rss / mib:,.0f} | {states / mib:,.0f} | {held / mib:,.0f} | {losses} "
              f"| {step_s:.1f} |", flush=True)
        shutil.rmtree(out, ignore_errors=True)  # gigabytes of checkpoint per run
print(f"\nload average after: {os.getloadavg()}")
