#!/usr/bin/env python3
"""Training speed of two trellis binaries on a recipe, alternating (A, B, A, B, ...): the median
tokens/s of 120 steps (the first 10 left out) per run, 3 runs each, and B/A; and each run's process
CPU time (user + sys), whose A/B ratio stays meaningful on a loaded machine where wall-clock
tokens/s does not (pass --threads 1 so no OpenMP thread spins while waiting for the other).
  python3 bench/ab_recipes.py A_BINARY B_BINARY [train args, e.g. --config configs/sections.toml]
With no train args it is the default job (README command 1)."""
import json, subprocess, statistics, sys, os, shutil, resource
A, B = sys.argv[1], sys.argv[2]
res = {"A": [], "B": []}
cpu = {"A": [], "B": []}
def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime
for r in range(3):
    for name, binary in (("A", A), ("B", B)):
        out = f"/tmp/abd_{name}"
        shutil.rmtree(out, ignore_errors=True)
        t0 = children_cpu()
        subprocess.run([binary, "train", *sys.argv[3:], "--out", out, "--steps", "120", "--val-every", "0", "--quiet", "--tensorboard=false"], check=True, stdout=subprocess.DEVNULL)
        cpu[name].append(children_cpu() - t0)
        rows = [json.loads(l) for l in open(out + "/metrics.jsonl") if '"tokens_per_s"' in l]
        res[name].append(statistics.median(r["tokens_per_s"] for r in rows[10:]))
print({k: [round(x) for x in v] for k, v in res.items()}, "B/A", round(statistics.median(res["B"]) / statistics.median(res["A"]), 3), "load", os.getloadavg()[0])
print("CPU s", {k: [round(x, 2) for x in v] for k, v in cpu.items()}, "A/B (B's speed by CPU time)", round(statistics.median(cpu["A"]) / statistics.median(cpu["B"]), 3))
