#!/usr/bin/env python3
"""Activation recomputation (issue 12): step time and activation memory of --recompute none,
selective and full for one command, one process, as a markdown table.

Each mode runs --repeats times, the modes in rotation (none, selective, full, none, ...); a run's
figure is the median step_ms over its steps after the first 2 (warm-up), and the table shows the
median over the runs, with activation_bytes (what the Contexts alive and the workspace hold, as
model/activation_memory predicts) and peak_rss_bytes from the last metrics row. Every run also
checks that the losses are bitwise those of `none`.

  flock /tmp/bench.lock /usr/bin/python3 bench/recompute_bench.py [--bin build/trellis]
      [--repeats 3] [-- extra train arguments]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SKIP = 2
DEFAULT = ["--model", "baby", "--seq-len", 256, "--batch-size", 8, "--steps", 10,
           "--val-every", 0, "--val-batches", 0, "--threads", 2, "--quiet", "--tensorboard",
           "false", "--precision", "fp32"]


def run(binary, args, out):
    cmd = [binary, "train"] + [str(a) for a in args] + ["--out", out]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    train = [r for r in rows if "loss" in r and "step_ms" in r]
    return cmd, train


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", default=os.path.join(ROOT, "build", "trellis"))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("extra", nargs="*")
    a = p.parse_args()
    args = DEFAULT + a.extra
    modes = ("none", "selective", "full")
    step_ms = {m: [] for m in modes}
    fastest = {m: float("inf") for m in modes}  # the fastest step of any run: less load-bound
    last, losses, cmds = {}, {}, {}
    load_before = os.getloadavg()
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(a.repeats):
            for m in modes:
                cmd, train = run(a.bin, args + ["--recompute", m], os.path.join(tmp, f"{m}{rep}"))
                cmds[m] = cmd
                step_ms[m].append(statistics.median(r["step_ms"] for r in train[SKIP:]))
                fastest[m] = min([fastest[m]] + [r["step_ms"] for r in train[SKIP:]])
                last[m] = train[-1]
                losses.setdefault(m, [r["loss"] for r in train])
    load_after = os.getloadavg()
    same = all(losses[m] == losses["none"] for m in modes)
    shown = [os.path.relpath(c, ROOT) if c == a.bin else c for c in cmds["none"][:-4]]
    print(f"command: `{' '.join(shown)} --recompute MODE`\n")
    print("| recompute | step ms (median of runs) | runs | vs none | fastest step ms | vs none | "
          "activation_bytes MiB | vs none | peak RSS MiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    base_ms = statistics.median(step_ms["none"])
    base_act = last["none"]["activation_bytes"]
    for m in modes:
        ms = statistics.median(step_ms[m])
        act = last[m]["activation_bytes"]
        print(f"| {m} | {ms:.0f} | {', '.join(f'{x:.0f}' for x in step_ms[m])} | "
              f"{ms / base_ms:.3f} | {fastest[m]:.0f} | {fastest[m] / fastest['none']:.3f} | "
              f"{act / 2**20:.1f} | {act / base_act:.3f} | "
              f"{last[m]['peak_rss_bytes'] / 2**20:.1f} |")
    print(f"\nlosses bitwise equal across modes: {same}")
    print(f"\n_{time.time() - t0:.0f} s, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"load {' '.join(f'{x:.2f}' for x in load_before)} → "
          f"{' '.join(f'{x:.2f}' for x in load_after)}_")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
