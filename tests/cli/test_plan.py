"""`trellis plan`: a ranked table and --json for every layout on a shipped machine file; a model
that fits nowhere gets the smallest world that fits; bad input is one line and exit code 2.
(Calibrating this machine into a machine file is checked in parallel/test_layout_auto, outside the
ASan pass: it times trellis's own kernels, which the sanitized build runs at -O1.)"""
import json
import re
import os

from trellis_test import SOURCE, TMP, check, expect_error, fresh_dir, run

a100 = os.path.join(SOURCE, "hardware", "dgx-a100-80gb.json")
h100 = os.path.join(SOURCE, "hardware", "dgx-h100.json")
base = ["plan", "--model", "gpt2-medium", "--world", 8, "--batch-size", 32, "--seq-len", 1024]

out, _ = run(base + ["--machine", a100])
rows = [l for l in out.splitlines() if re.match(r"^ *[0-9]+  [a-z]", l)]
check(len(rows) == 10 and "(first)" in rows[0], f"ten ranked layouts, the first marked: {rows[:2]}")
check(all(" ms" in r or "ties" in r for r in rows[1:]), "each later layout says why it loses")

out, _ = run(base + ["--machine", h100, "--json"])
plan = json.loads(out)
layouts = plan["layouts"]
fitting = [l for l in layouts if l["fits"]]
check(plan["fitting"] == len(fitting) > 10, f"{plan['fitting']} fitting layouts")
rates = [l["time"]["tokens_per_s"] for l in fitting]
check(rates == sorted(rates, reverse=True), "ranked by tokens/s")
check(all(l["memory"]["total"] <= plan["device_memory"] for l in fitting), "fitting ones fit")
check({l["zero"] for l in layouts if l["pp"] > 1} <= {0, 1}, "no ZeRO-2/3 with a pipeline")
for key in ("params", "grads", "optimizer", "activations"):
    check(key in fitting[0]["memory"], f"memory split has {key}")
for key in ("compute_s", "bubble_s", "dp_comm_s", "tp_comm_s", "mfu"):
    check(key in fitting[0]["time"], f"time split has {key}")

# Sizes instead of a preset (Narayanan et al.'s 1.7B GPT).
out, _ = run(["plan", "--model", "layers=24,width=2304,heads=24", "--vocab", 51200, "--world", 32,
              "--batch-size", 512, "--seq-len", 2048, "--machine", a100, "--top", 3])
check("(first)" in out, "a model given by its sizes plans")

# Nothing fits: an 8 GiB device for gpt2-xl on one rank.
small = os.path.join(fresh_dir("plan"), "small.json")
with open(a100) as f:
    m = json.load(f)
m["device"]["memory_bytes"] = 8 << 30
with open(small, "w") as f:
    json.dump(m, f)
out, _ = run(["plan", "--model", "gpt2-xl", "--world", 1, "--batch-size", 8, "--seq-len", 1024,
              "--machine", small])
check("nothing fits" in out and "smallest world that fits:" in out, f"smallest world reported: {out}")
out, _ = run(["plan", "--model", "gpt2-xl", "--world", 1, "--batch-size", 8, "--seq-len", 1024,
              "--machine", small, "--json"])
j = json.loads(out)
check(j["fitting"] == 0 and j["smallest_world"] > 1, f"--json smallest_world {j.get('smallest_world')}")


m = json.load(open(a100))
m["device"]["peak_flops"]["bf16"] = "fast"
bad = os.path.join(TMP, "plan", "bad.json")
with open(bad, "w") as f:
    json.dump(m, f)
expect_error(base + ["--machine", bad], "bad.json", "device.peak_flops.bf16")
expect_error(base + ["--machine", os.path.join(TMP, "plan", "missing.json")], "missing.json")
expect_error(base + ["--machine", a100, "--precision", "fp16"], "--precision")
expect_error(base + ["--machine", a100, "--grad-reduce-dtype", "fp16"], "--grad-reduce-dtype",
             "fp16")
expect_error(["plan", "--model", "gpt9", "--world", 8, "--batch-size", 8, "--seq-len", 64,
              "--machine", a100], "gpt9")
expect_error(["plan", "--model", "layers=2,width=64,heads=3", "--world", 1, "--batch-size", 8,
              "--seq-len", 64, "--machine", a100])
expect_error(base[:4] + [0] + base[5:] + ["--machine", a100], "--world")
print("ok")

cal = os.path.join(TMP, "plan", "this.json")
expect_error(["calibrate", "--out", cal, "--seconds", 0], "--seconds")
expect_error(["calibrate", "--out", cal, "--rounds", 0], "--rounds")
print("ok")
