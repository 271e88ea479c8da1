#!/usr/bin/env python3
"""trellis vs PyTorch-eager training throughput on the CPU, same machine, same run.

For each configuration the two sides run alternately (trellis, torch, trellis, ...,
--repeats times each), so load from other jobs on the machine hits both alike:

  baby  6L/6H/384, batch 8 x 256, vocab 256: trellis' built-in byte corpus
  gpt2  12L/12H/768 (124M), batch 4 x 64, vocab 50257: a data directory prepared from
        /usr/share/common-licenses with the GPT-2 tokenizer (tests/data/gpt2)

Both train with AdamW (weight decay on 2-D weights, grad clip 1.0). The trellis
ms/step is the median of metrics.jsonl's step_ms over the steps after the first 2;
torch's comes from bench/torch_gpt_bench.py (median after 2 warm-ups). Over repeats,
the median of the per-run medians is reported. Prints a markdown table.

  /usr/bin/python3 bench/run_bench.py --steps 10 --repeats 2 [--configs baby,gpt2]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SKIP = 2  # warm-up steps left out on both sides

CONFIGS = {
    "baby": dict(label="baby (6L/384) 8x256", preset="baby", batch=8, seq=256, data=None),
    "gpt2": dict(label="gpt2 124M 4x64", preset="gpt2", batch=4, seq=64, data="gpt2"),
}


def sh(cmd, **kw):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    if p.returncode != 0:
        sys.exit(f"command failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout}\n{p.stderr}")
    return p.stdout


def prepare_gpt2_data(trellis, work):
    out = os.path.join(work, "data_gpt2")
    if not os.path.exists(os.path.join(out, "meta.json")):
        sh([trellis, "prepare", "--input", "/usr/share/common-licenses", "--out", out,
            "--tokenizer", "gpt2", "--tokenizer-dir", os.path.join(ROOT, "tests", "data", "gpt2")])
    with open(os.path.join(out, "meta.json")) as f:
        vocab = json.load(f)["vocab_size"]
    if vocab != 50257:
        sys.exit(f"{out}: vocab_size {vocab}, expected 50257")
    return out


def run_trellis(trellis, cfg, steps, threads, work, data):
    out = os.path.join(work, "trellis_out")
    shutil.rmtree(out, ignore_errors=True)
    cmd = [trellis, "train", "--model", cfg["preset"], "--batch-size", str(cfg["batch"]),
           "--seq-len", str(cfg["seq"]), "--steps", str(steps), "--val-every", "0",
           "--val-batches", "1", "--tensorboard=false", "--quiet=true", "--out", out,
           "--threads", str(threads)]
    if data:
        cmd += ["--data", data]
    sh(cmd)
    rows = []
    with open(os.path.join(out, "metrics.jsonl")) as f:
        for line in f:
            m = json.loads(line)
            if "step_ms" in m:
                rows.append(m)
    rows.sort(key=lambda m: m["step"])
    rows = rows[SKIP:]
    shutil.rmtree(out, ignore_errors=True)  # gpt2 checkpoints are ~1.5 GB
    if not rows:
        sys.exit("trellis wrote no timed steps")
    return dict(ms=statistics.median(m["step_ms"] for m in rows),
                tok_s=statistics.median(m["tokens_per_s"] for m in rows),
                mfu=statistics.median(m["mfu"] for m in rows) if "mfu" in rows[0] else None)


def run_torch(python, cfg, steps, threads):
    out = sh([python, os.path.join(HERE, "torch_gpt_bench.py"), "--preset", cfg["preset"],
              "--batch", str(cfg["batch"]), "--seq", str(cfg["seq"]), "--steps", str(steps),
              "--threads", str(threads)])
    r = json.loads(out.strip().splitlines()[-1])
    return dict(ms=r["ms_per_step"], tok_s=r["tokens_per_s"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10, help="steps per run, 2 warm-ups included")
    ap.add_argument("--repeats", type=int, default=1, help="runs of each side per config")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--configs", default="baby,gpt2", help="comma list of: baby, gpt2")
    ap.add_argument("--trellis", default=os.path.join(ROOT, "build", "trellis"))
    ap.add_argument("--python", default="/usr/bin/python3", help="python with torch")
    ap.add_argument("--work", default="", help="scratch directory (default: a temp dir)")
    a = ap.parse_args()
    if a.steps <= SKIP:
        ap.error(f"--steps must exceed the {SKIP} warm-up steps")
    names = [c for c in a.configs.split(",") if c]
    for c in names:
        if c not in CONFIGS:
            ap.error(f"unknown config {c!r} (choose from {', '.join(CONFIGS)})")
    work = a.work or tempfile.mkdtemp(prefix="trellis_bench_")
    os.makedirs(work, exist_ok=True)

    results = []
    for name in names:
        cfg = CONFIGS[name]
        data = prepare_gpt2_data(a.trellis, work) if cfg["data"] == "gpt2" else None
        tr, to = [], []
        for r in range(a.repeats):
            tr.append(run_trellis(a.trellis, cfg, a.steps, a.threads, work, data))
            print(f"# {name} run {r + 1}/{a.repeats} trellis: {tr[-1]['ms']:.1f} ms/step",
                  file=sys.stderr, flush=True)
            to.append(run_torch(a.python, cfg, a.steps, a.threads))
            print(f"# {name} run {r + 1}/{a.repeats} torch:   {to[-1]['ms']:.1f} ms/step",
                  file=sys.stderr, flush=True)
        med = lambda rs, k: statistics.median(x[k] for x in rs)  # noqa: E731
        mfus = [x["mfu"] for x in tr if x["mfu"] is not None]
        results.append(dict(label=cfg["label"], t_ms=med(tr, "ms"), p_ms=med(to, "ms"),
                            t_tok=med(tr, "tok_s"), p_tok=med(to, "tok_s"),
                            mfu=statistics.median(mfus) if mfus else None))
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)

    print(f"\n{a.threads} threads each, {a.steps} steps per run ({a.steps - SKIP} timed), "
          f"{a.repeats} run(s) per side, AdamW, fp32\n")
    print("| config | trellis ms/step | torch ms/step | trellis/torch time | "
          "trellis tok/s | torch tok/s | trellis MFU |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a"
        print(f"| {r['label']} | {r['t_ms']:.1f} | {r['p_ms']:.1f} | {r['t_ms'] / r['p_ms']:.2f} | "
              f"{r['t_tok']:.0f} | {r['p_tok']:.0f} | {mfu} |")


if __name__ == "__main__":
    main()
