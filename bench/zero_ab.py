#!/usr/bin/env python3
"""ZeRO-2 and ZeRO-3 against ZeRO-0 (issue 27 §3: a sharded step at most 1.15x a replicated one),
for one or more binaries: baby, --dp 2 on one host (2 ranks, 1 thread each, shared memory),
global batch 8 x 256, fp32. Each round runs every binary at every stage, alternating, so load from
other jobs hits all alike; ms/step is the median of step_ms after the first 2 steps. Prints each
round's runs, the ratios to ZeRO-0 within each round and their medians, the page faults per rank
(perf stat, when perf is installed) and the memory counters.

  /usr/bin/python3 bench/zero_ab.py BIN [BIN ...] [--steps 8] [--rounds 3] [--stages 0,2,3]
                                    [--cluster-rate 1gbit] [--grad-reduce-dtypes fp32,bf16]

--cluster-rate RATE runs the 2 ranks on 2 "nodes" of a network-namespace cluster instead
(scripts/netns_cluster.sh, one rank per node, links shaped to RATE; run as root): the issue's
goal holds "locally and on the cluster". Page faults are not counted there.

--grad-reduce-dtypes runs every stage with each grad_reduce_dtype (default fp32 only); ratios are
to ZeRO-0 with the same type.

Run it under `flock /work/measure.lock` on a shared machine and report `uptime` with it.
"""
import argparse
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

import ab_rounds

BASE = ["--model", "baby", "--batch-size", "8", "--seq-len", "256", "--threads", "1",
        "--val-every", "0", "--tensorboard", "false", "--quiet", "--seed", "1337",
        "--precision", "fp32", "--dp", "2"]


SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts",
                      "netns_cluster.sh")


@contextlib.contextmanager
def cluster_up(rate):
    """A 2-node namespace cluster at `rate` for the block's runs (None: none), always torn down."""
    if not rate:
        yield None
        return
    name = f"zab{os.getpid() % 100000}"
    subprocess.run([SCRIPT, "up", "2", "--name", name, "--slots", "1", "--rate", rate], check=True)
    try:
        yield name
    finally:
        subprocess.run([SCRIPT, "down", "--name", name], check=True)


def run(binary, zero, dtype, steps, out, cluster=None):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    perf = []
    if shutil.which("perf") and not cluster:
        # One file per rank: perf expands no rank in -o, so each rank's shell names its own.
        perf = ["sh", "-c", 'exec perf stat -e page-faults -x, -o "$0.$OMPI_COMM_WORLD_RANK" "$@"',
                os.path.join(out, "perf")]
    launcher = ["mpirun", "--oversubscribe", "--bind-to", "none", "--mca", "mpi_yield_when_idle",
                "1", "-np", "2"]
    if cluster:
        launcher = [SCRIPT, "run", "--name", cluster, "--timeout", "600", "--", "-np", "2",
                    "--map-by", "node"]
    cmd = [*launcher, *perf, binary, "train", *BASE, "--zero", str(zero), "--steps", str(steps),
           "--grad-reduce-dtype", dtype, "--out", out]
    os.makedirs(out, exist_ok=True)
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    rows = [json.loads(x) for x in open(os.path.join(out, "metrics.jsonl"))]
    rows = [x for x in rows if "step_ms" in x]
    timed = [x for x in rows if x["step"] > 2]
    faults = []
    for r in range(2):
        path = os.path.join(out, f"perf.{r}")
        if os.path.exists(path):
            m = re.search(r"^(\d+),,page-faults", open(path).read(), re.M)
            faults.append(int(m.group(1)) if m else -1)
    return {"ms": statistics.median(x["step_ms"] for x in timed),
            "exposed": statistics.median(x.get("comm_exposed_ms", 0.0) for x in timed),
            "alloc_peak": rows[-1]["alloc_peak_bytes"], "mem": rows[-1]["mem_bytes"],
            "faults": faults}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("binaries", nargs="+")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--stages", default="0,2,3")
    ap.add_argument("--cluster-rate", help="2 namespace nodes, one rank each, links at this rate")
    ap.add_argument("--grad-reduce-dtypes", default="fp32")
    a = ap.parse_args()
    dtypes = a.grad_reduce_dtypes.split(",")
    stages = [int(z) for z in a.stages.split(",")]
    if stages[0] != 0:
        sys.exit("--stages must start with 0 (the ratios' base)")
    bins = [os.path.abspath(b) for b in a.binaries]
    with tempfile.TemporaryDirectory(prefix="zero_ab_") as work, \
            cluster_up(a.cluster_rate) as cluster:
        res, loads = ab_rounds.alternate(
            a.rounds, [(b, z, d) for z in stages for d in dtypes for b in bins],
            lambda c, r: run(*c, a.steps, tempfile.mkdtemp(prefix=f"{c[1]}_{r}_", dir=work),
                             cluster),
            lambda c, r, x: f"round {r + 1} {c[0]} zero {c[1]} {c[2]}: {x['ms']:.0f} ms/step, "
                            f"exposed {x['exposed']:.0f} ms, faults {x['faults']}")
    where = f"across 2 namespace nodes at {a.cluster_rate}" if a.cluster_rate else "one host"
    print(f"\n{where}: {a.rounds} rounds × {a.steps} steps (median of steps 3–{a.steps}); "
          f"1-minute load {ab_rounds.load_range(loads)}\n")
    print("| binary | ZeRO | gradients | ms/step, median (runs) | / ZeRO-0 per round (median) "
          "| exposed ms | page faults per rank | alloc_peak_bytes | mem_bytes |")
    print("|---|---|---|---|---|---|---|---|---|")
    for b, z, d in ((b, z, d) for b in bins for z in stages for d in dtypes):
        xs = res[(b, z, d)]
        ratios = [x["ms"] / x0["ms"] for x, x0 in zip(xs, res[(b, 0, d)])]
        faults = [f for x in xs for f in x["faults"]]
        runs = " / ".join(f"{x['ms']:.0f}" for x in xs)
        print(f"| {b} | {z} | {d} | {statistics.median(x['ms'] for x in xs):.0f} ({runs}) | "
              f"{' / '.join(f'{q:.2f}' for q in ratios)} ({statistics.median(ratios):.2f}) | "
              f"{statistics.median(x['exposed'] for x in xs):.0f} | "
              f"{statistics.median(faults) if faults else '-'} | {xs[-1]['alloc_peak']} | "
              f"{xs[-1]['mem']} |")


if __name__ == "__main__":
    main()
