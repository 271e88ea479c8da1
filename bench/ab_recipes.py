#!/usr/bin/env python3
"""Training speed of two trellis binaries on a recipe, alternating (A, B, A, B, ...): the median
tokens/s of 120 steps (the first 10 left out) per run, 3 runs each, and B/A.
  python3 bench/ab_recipes.py A_BINARY B_BINARY [train args, e.g. --config configs/sections.toml]
With no train args it is the default job (README command 1)."""
import json, subprocess, statistics, sys, os, shutil
A, B = sys.argv[1], sys.argv[2]
res = {"A": [], "B": []}
for r in range(3):
    for name, binary in (("A", A), ("B", B)):
        out = f"/tmp/abd_{name}"
        shutil.rmtree(out, ignore_errors=True)
        subprocess.run([binary, "train", *sys.argv[3:], "--out", out, "--steps", "120", "--val-every", "0", "--quiet", "--tensorboard=false"], check=True, stdout=subprocess.DEVNULL)
        rows = [json.loads(l) for l in open(out + "/metrics.jsonl") if '"tokens_per_s"' in l]
        res[name].append(statistics.median(r["tokens_per_s"] for r in rows[10:]))
print({k: [round(x) for x in v] for k, v in res.items()}, "B/A", round(statistics.median(res["B"]) / statistics.median(res["A"]), 3), "load", os.getloadavg()[0])
