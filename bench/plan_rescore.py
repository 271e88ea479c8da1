#!/usr/bin/env python3
"""Re-plans saved bench/plan_check.py runs with another trellis binary: each run's own machine
files (machine_w1.json, machine_w2.json) and measured rows, predictions from `trellis plan` of the
binary given. Shows what a cost-model change does to runs already measured, before measuring
again. A run directory whose name contains "pcC" is a cluster run (--ranks-per-node 1), as
plan_check names them with --cluster-rate.

Usage: plan_rescore.py TRELLIS RUN_DIR [RUN_DIR ...]   (defaults as plan_check: baby, 8 x 256)"""
import json
import os
import statistics
import subprocess
import sys


def rescore(trellis, run):
    d = json.load(open(os.path.join(run, "plan_check.json")))
    cluster = "pcC" in os.path.basename(run.rstrip("/"))
    worlds = sorted({r["world"] for r in d["rows"]})
    preds, firsts = {}, {}
    for w in worlds:
        cmd = [trellis, "plan", "--model", "baby", "--vocab", "256", "--world", str(w),
               "--batch-size", "8", "--seq-len", "256", "--precision", "bf16", "--machine",
               os.path.join(run, f"machine_w{w}.json"), "--json"]
        if cluster:
            cmd += ["--ranks-per-node", "1"]
        plan = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
        for c in plan["layouts"]:
            preds[(w, c["layout"])] = c["time"]["step_s"]
        firsts[w] = plan["layouts"][0]["layout"]
    errors = [abs(preds[(r["world"], r["layout"])] / r["measured_s"] - 1) for r in d["rows"]]
    out = []
    for w in worlds:
        rows = [r for r in d["rows"] if r["world"] == w]
        fastest = min(r["measured_s"] for r in rows)
        mine = [r for r in rows if r["layout"] == firsts[w]]
        out.append(f"world {w} first {firsts[w]} " +
                   (f"{mine[0]['measured_s'] / fastest - 1:+.1%}" if mine else "(not measured)"))
    print(f"{run}: median {statistics.median(errors):.1%} worst {max(errors):.1%}; "
          + "; ".join(out))


for run in sys.argv[2:]:
    rescore(sys.argv[1], run)
