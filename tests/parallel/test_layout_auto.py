"""`trellis calibrate` (one rank, and two ranks' collectives) writes a machine file that `plan`
reads back; `trellis train --layout auto` takes the plan's first layout, on a machine file or on
this machine calibrated at start, for one process and under mpirun (every rank runs rank 0's
choice); a layout that fits nowhere is refused before anything is written. Kept out of the ASan
pass (cli/test_plan runs the planner there): calibration times trellis's own kernels, which the
sanitized build compiles at -O1, and these runs train under mpirun."""
import json
import os
import re

from trellis_test import check, expect_error, fresh_dir, metrics, mpirun, run


work = fresh_dir("plan_auto")
# calibrate: this machine as a machine file that plan reads back.
cal = os.path.join(work, "one.json")
out, _ = run(["calibrate", "--out", cal, "--threads", 1, "--seconds", 0.05, "--gemm-size", 256])
m = json.load(open(cal))
check(m["device"]["peak_flops"]["fp32"] > 1e9 and m["device"]["memory_bandwidth"] > 1e8,
      f"calibrate measured GEMM and memory rates: {out.strip()}")
for precision in ("fp32", "bf16"):
    fit = m["device"]["gemm"][precision]
    check(fit["rate"] > 1e9 and len(fit["table"]) == 9 and fit["table"][-1]["m"] == 256,
          f"{precision}: a GEMM fit over nine shapes, the last the --gemm-size cube: {fit['rate']}")
    back = fit["backward"]
    check(back["rate"] > 1e8 and len(back["table"]) == 9,
          f"{precision}: the backward GEMMs fitted over the same shapes: {back['rate']}")
for key in ("attention_flops", "elementwise_bandwidth", "page_refill_bandwidth"):
    check(m["device"][key] > 1e6, f"calibrate measured {key}: {m['device'][key]}")
out, _ = run(["plan", "--model", "baby", "--world", 2, "--batch-size", 8, "--seq-len", 64,
              "--precision", "fp32", "--machine", cal, "--top", 3])
check("(first)" in out, "plan reads a calibrated machine file")
check("fastest of 3 rounds" in m["sources"]["measured"], f"three rounds: {m['sources']}")

cal2 = os.path.join(work, "two.json")
# One round of the compute measurements (the 1-rank file above checks the three): this one is for
# the links, and every round times every GEMM shape on both ranks (~7 CPU-seconds a rank here).
mpirun(2, ["calibrate", "--out", cal2, "--seconds", 0.05, "--gemm-size", 256, "--rounds", 1])
link = json.load(open(cal2))["intra_node"]
for kind in ("all_reduce", "reduce_scatter", "all_gather", "send_recv"):
    fit = link["collectives"][kind]
    check(fit["bandwidth"] > 1e6 and 0 < fit["latency"] < 1, f"two ranks: {kind} fitted: {fit}")
    sizes = [row["bytes"] for row in fit["per_step"]]
    check(len(sizes) == 4 and sizes == sorted(sizes) and sizes[0] < sizes[-1] / 1000,
          f"two ranks: {kind} timed at four sizes, 1 KiB to 64 MiB: {fit['per_step']}")
auto = ["train", "--model", "tiny", "--batch-size", 8, "--seq-len", 64, "--steps", 2,
        "--val-every", 0, "--tensorboard", "false", "--layout", "auto"]
for world, machine in ((1, cal), (2, cal2)):
    out_dir = os.path.join(work, f"w{world}")
    args = auto + ["--out", out_dir, "--machine", machine]
    out, _ = run(args) if world == 1 else mpirun(2, args)
    chosen = re.search(r"layout auto: (.+?) \(predicted", out)
    check(chosen is not None, f"world {world}: the chosen layout is printed: {out[:300]}")
    # a pipeline's header names its schedule after pp ("pp 2 gpipe"), whichever layout comes first
    header = re.search(r"world \d+ \(dp (\d+), tp (\d+), pp (\d+)(?: \w+)?, zero (\d+)\).*"
                       r"micro-batches of (\d+)", out)
    check(header is not None, f"world {world}: the run's header: {out[:600]}")
    plan_args = ["plan", "--model", "tiny", "--vocab", 256, "--world", world, "--batch-size", 8,
                 "--seq-len", 64, "--machine", machine, "--json"]
    plan_args += ["--precision", re.search(r"threads/rank, (\w+)", out).group(1)]
    first = json.loads(run(plan_args)[0])["layouts"][0]
    check(chosen.group(1) == first["layout"],
          f"world {world}: auto took the plan's first layout: {chosen.group(1)} / {first['layout']}")
    got = tuple(int(x) for x in header.groups())
    want = (first["dp"], first["tp"], first["pp"], first["zero"], first["micro_batch"])
    check(got == want, f"world {world}: the run used it: {got} == {want}")
    check(len(metrics(out_dir)[0]) == 2, f"world {world}: it trained")
# Calibrated at start when no file is given.
out, _ = mpirun(2, auto + ["--out", os.path.join(work, "cal")])
check("layout auto: dp" in out and "measured by trellis calibrate" in out,
      f"calibrated at start: {out[:300]}")
expect_error(auto + ["--out", os.path.join(work, "x"), "--tp", 2], "tp must not be set")
expect_error(auto + ["--out", os.path.join(work, "x"), "--dry-run"], "trellis plan")
tiny_mem = os.path.join(work, "tiny_memory.json")
m = json.load(open(cal))
m["device"]["memory_bytes"] = 1 << 16
with open(tiny_mem, "w") as f:
    json.dump(m, f)
expect_error(auto + ["--out", os.path.join(work, "x"), "--machine", tiny_mem], "layout auto",
             "no layout")
check(not os.path.exists(os.path.join(work, "x")), "nothing written on a refused layout")
print("ok")
