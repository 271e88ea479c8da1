#!/usr/bin/env python3
"""Two trellis binaries side by side (A = before a change, B = after): fp32 training speed of the
same jobs, run alternately A, B, A, B, ... so that load from other jobs hits both alike.

  baby  6L/6H/384, batch 8 x 256, built-in byte corpus
  gpt2  12L/12H/768 (124M), batch 4 x 64, GPT-2 BPE data prepared from /usr/share/common-licenses

ms/step is the median of metrics.jsonl's step_ms after the first 2 steps; over repeats, the median
of the per-run medians. Prints a markdown table with B/A tokens/s.

  python3 bench/ab_binaries.py A_BINARY B_BINARY [--steps 12] [--repeats 3] [--threads 2]
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile

import ab_rounds

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = {"baby": ["--model", "baby", "--batch-size", 8, "--seq-len", 256],
           "gpt2": ["--model", "gpt2", "--batch-size", 4, "--seq-len", 64]}


def ms_per_step(binary, args, out):
    cmd = [binary, "train", *map(str, args), "--out", out, "--quiet", "--tensorboard=false",
           "--val-every", "0"]
    subprocess.run(cmd, check=True, capture_output=True)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        steps = [json.loads(line)["step_ms"] for line in f if '"step_ms"' in line]
    return statistics.median(steps[2:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--configs", default="baby,gpt2")
    o = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="trellis-ab-")
    gpt2_data = os.path.join(tmp, "gpt2_data")
    subprocess.run([o.a, "prepare", "--input", "/usr/share/common-licenses", "--out", gpt2_data,
                    "--tokenizer", "gpt2", "--tokenizer-dir",
                    os.path.join(ROOT, "tests", "data", "gpt2")], check=True, capture_output=True)
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    print("| job | A ms/step | B ms/step | B/A tokens/s | runs |")
    print("|---|---|---|---|---|")
    for name in o.configs.split(","):
        args = CONFIGS[name] + ["--steps", o.steps, "--threads", o.threads, "--save-every", 0]
        if name == "gpt2":
            args += ["--data", gpt2_data]
        runs, _ = ab_rounds.alternate(
            o.repeats, ("a", "b"),
            lambda side, r: ms_per_step(getattr(o, side), args,
                                        os.path.join(tmp, f"{name}_{side}_{r}")))
        a, b = statistics.median(runs["a"]), statistics.median(runs["b"])
        print(f"| {name} | {a:.1f} | {b:.1f} | {a / b:.3f} | "
              f"A {', '.join(f'{x:.0f}' for x in runs['a'])}; "
              f"B {', '.join(f'{x:.0f}' for x in runs['b'])} |", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
