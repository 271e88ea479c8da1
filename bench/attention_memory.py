"""Activation memory against sequence length (issue 25 §2): for each T, the `train --dry-run
--json` prediction of activations next to what two training steps measure (alloc_peak_bytes, the
allocator's high-water mark of everything, and activation_bytes, the Contexts and workspace the
model allocated). Attention that keeps its T x T probabilities grows with T^2 per head; the tiled
kernel keeps a [B, H, T] logsumexp.

usage: python3 bench/attention_memory.py TRELLIS_BIN OUT [--model gpt2] [--n-layer 4]
  [--seq-lens 256,512,1024,2048] [--batch-size 1] [--steps 2] [--threads 2]
Prints a Markdown table (MiB)."""
import argparse
import json
import os
import shutil
import subprocess

p = argparse.ArgumentParser()
p.add_argument("trellis")
p.add_argument("out")
p.add_argument("--model", default="gpt2")
p.add_argument("--n-layer", type=int, default=4)
p.add_argument("--seq-lens", default="256,512,1024,2048")
p.add_argument("--batch-size", type=int, default=1)
p.add_argument("--steps", type=int, default=2)
p.add_argument("--threads", type=int, default=2)
a = p.parse_args()

mib = 1 << 20
print(f"load average before: {os.getloadavg()}")
print(f"{a.model} with {a.n_layer} blocks, batch {a.batch_size}, {a.steps} steps, fp32, "
      f"{a.threads} threads; MiB\n")
print("| T | predicted activations | measured activation_bytes | measured alloc_peak_bytes "
      "| predicted total |")
print("|---:|---:|---:|---:|---:|")
for T in map(int, a.seq_lens.split(",")):
    common = ["train", "--model", a.model, "--n-layer", str(a.n_layer), "--block-size",
              str(max(T, 1024)), "--seq-len", str(T), "--batch-size", str(a.batch_size),
              "--steps", str(a.steps), "--val-every", "0", "--val-batches", "0", "--threads",
              str(a.threads), "--quiet", "--tensorboard", "false", "--precision", "fp32"]
    dry = subprocess.run([a.trellis] + common + ["--dry-run", "--json"], check=True,
                         capture_output=True, text=True)
    pred = json.loads(dry.stdout)[0]
    out = os.path.join(a.out, f"T{T}")
    shutil.rmtree(out, ignore_errors=True)
    subprocess.run([a.trellis] + common + ["--out", out], check=True)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        rows = [r for r in map(json.loads, f) if "loss" in r]
    peak = max(r["alloc_peak_bytes"] for r in rows)
    act = max(r["activation_bytes"] for r in rows)
    print(f"| {T} | {(pred['activations'] + pred['workspace']) / mib:,.1f} | {act / mib:,.1f} "
          f"| {peak / mib:,.1f} | {pred['total'] / mib:,.1f} |", flush=True)
print(f"\nload average after: {os.getloadavg()}")
