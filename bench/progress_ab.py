#!/usr/bin/env python3
"""Local multi-rank runs with trellis's MPI progress thread on and off (issue 27 §2): does it make
any layout slower on one machine? One binary; "off" sets TRELLIS_MPI_PROGRESS_US=0 (MPI then runs
as before the thread existed: MPI_THREAD_FUNNELED, operations moved only when tested).

  dp2      baby, --dp 2 (bucketed all-reduce during backward)
  zero2    baby, --dp 2 --zero 2 (a reduce-scatter per block per micro-batch)
  zero3    baby, --dp 2 --zero 3 (and a gather per block, prefetched)
  tp2      baby, --tp 2 (many small blocking all-reduces: the thread's wake-ups cost most here)
  pp2      baby, --pp 2, micro-batches of 2 (4 per step), 1F1B (sends polled between blocks)

Global batch 8 x 256, 1 thread per rank, fp32. Runs alternate off, on, off, on, ... per config so
that load from other jobs hits both alike; ms/step is the median of step_ms after the first 2
steps, then the median over repeats. Prints a markdown table with on/off ratios.

  /usr/bin/python3 bench/progress_ab.py [--trellis build/trellis] [--steps 8] [--repeats 3]
                                        [--configs dp2,pp2] [--poll-us N]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import ab_rounds

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE = ["--model", "baby", "--batch-size", "8", "--seq-len", "256", "--threads", "1",
        "--val-every", "0", "--tensorboard", "false", "--quiet", "--seed", "1337",
        "--precision", "fp32"]
CONFIGS = {"dp2": ["--dp", "2"], "zero2": ["--dp", "2", "--zero", "2"],
           "zero3": ["--dp", "2", "--zero", "3"], "tp2": ["--tp", "2"],
           "pp2": ["--pp", "2", "--micro-batch-size", "2", "--schedule", "1f1b"]}


def run(trellis, extra, steps, progress, out, poll_us):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env.pop("TRELLIS_MPI_PROGRESS_US", None)
    xs = ["-x", f"TRELLIS_MPI_PROGRESS_US={poll_us if progress else 0}"] if poll_us or not progress \
        else []
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "--mca", "mpi_yield_when_idle", "1",
           "-np", "2", *xs, trellis, "train", *BASE, *extra, "--steps", str(steps), "--out", out]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    rows = [json.loads(x) for x in open(os.path.join(out, "metrics.jsonl"))]
    rows = [x for x in rows if "step_ms" in x and x["step"] > 2]
    return (statistics.median(x["step_ms"] for x in rows),
            statistics.median(x.get("comm_exposed_ms", 0.0) for x in rows))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trellis", default=os.path.join(ROOT, "build", "trellis"))
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--poll-us", type=int, default=0,
                    help="the progress thread's interval in the 'on' runs (default: trellis's)")
    a = ap.parse_args()
    trellis = os.path.abspath(a.trellis)
    names = a.configs.split(",")
    with tempfile.TemporaryDirectory(prefix="progress_ab_") as work:
        res, loads = ab_rounds.alternate(
            a.repeats, [(n, on) for n in names for on in (False, True)],
            lambda c, r: run(trellis, CONFIGS[c[0]], a.steps, c[1],
                             os.path.join(work, f"{c[0]}_{int(c[1])}_{r}"), a.poll_us),
            lambda c, r, x: f"{c[0]} progress {'on' if c[1] else 'off'}: {x[0]:.0f} ms/step, "
                            f"exposed {x[1]:.0f} ms")
    print(f"\n{a.repeats} rounds × {a.steps} steps; 1-minute load {ab_rounds.load_range(loads)}\n")
    print("| config (baby, 2 ranks, 1 thread each) | off: ms/step (runs) | on: ms/step (runs) "
          "| on/off step time | exposed ms off / on |")
    print("|---|---|---|---|---|")
    for n in names:
        off, on = res[(n, False)], res[(n, True)]
        m_off = statistics.median(x[0] for x in off)
        m_on = statistics.median(x[0] for x in on)
        print(f"| {n} {' '.join(CONFIGS[n])} | {m_off:.0f} ({' / '.join(f'{x[0]:.0f}' for x in off)}) "
              f"| {m_on:.0f} ({' / '.join(f'{x[0]:.0f}' for x in on)}) | {m_on / m_off:.3f} | "
              f"{statistics.median(x[1] for x in off):.0f} / "
              f"{statistics.median(x[1] for x in on):.0f} |")


if __name__ == "__main__":
    main()
