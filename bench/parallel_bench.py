#!/usr/bin/env python3
"""trellis parallel benchmarks on one machine: DP, all-reduce, TP and PP, as markdown tables.

  (a) DP scaling: `baby` at a fixed global batch of 8 x 256 tokens, dp=1 (one process, 1 thread)
      against `mpirun -np 2 trellis train --dp 2 --threads 1`; efficiency = t1 / (2 t2) from the
      median step_ms. The peer is PyTorch DDP (gloo, bench/torch_ddp_bench.py), run in the same
      invocation. Also: the share of DP communication hidden behind backward, 1 - exposed(default
      25 MiB buckets) / exposed(--bucket-mb 100000, one bucket launched after backward), from the
      median comm_exposed_ms and, because comm_exposed_ms misses work done inside MPI_Test during
      backward, from step times over perfect scaling; and ZeRO-1's mem_bytes (parameters +
      gradients + optimizer, rank 0) against ZeRO-0 at dp=2. Every dp config also runs with
      glibc malloc's mmap off ("[no-mmap]", see NO_MMAP below).
  (b) all-reduce bus bandwidth of the trellis communicator against MPI_Allreduce:
      `mpirun -np 2 build/allreduce_bench` (its own table, reformatted), ratio at >= 4 MiB;
      again with malloc's mmap off.
  (c) TP: per-rank mem_bytes at tp=2 vs tp=1; throughput of tp=2 (2 processes x 1 thread) vs one
      process with 2 threads; share of the step spent in TP communication (tp_comm_ms / step_ms),
      with and without --sequence-parallel.
  (d) PP: measured bubble (mean over stages of 1 - compute / step, as trellis logs it) vs the
      theoretical (p - 1) / (m + p - 1) / V, for pp in {2, 4}, m in {4, 8, 16} micro-batches,
      1F1B, and interleaved V=2 at pp=2 (baby with 8 layers, seq-len 64, micro-batch 2); then
      activation memory on the first stage at pp=4, m=16: peak_micro_batches and
      peak_rss_bytes_max, 1F1B vs GPipe (seq-len 256, micro-batch 1, so activations dominate).

Every trellis number is the median over the steps after the first 2 (warm-up) of metrics.jsonl;
in (a) and (c) the configurations run in rotation (--dp-repeats, --repeats times) and the median
of the per-run medians is shown. The machine is shared, so compare ratios, not absolute times.

  /usr/bin/python3 bench/parallel_bench.py                 # everything, ~13 minutes on 2 cores
  /usr/bin/python3 bench/parallel_bench.py --quick         # smoke run (tiny steps), ~3 minutes
  /usr/bin/python3 bench/parallel_bench.py --sections a,d  # a subset

As root, OpenMPI needs OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 (set here);
with more ranks than cores the runs add --oversubscribe --mca mpi_yield_when_idle 1.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SKIP = 2  # warm-up steps left out of every median
CORES = os.cpu_count() or 1
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")

COMMON = ["--val-every", "0", "--tensorboard", "false", "--quiet", "--seed", "1337"]


def load():
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


def mpirun(np_):
    if np_ == 1:
        return []
    cmd = ["mpirun", "-np", str(np_)]
    if np_ > CORES:
        cmd += ["--oversubscribe", "--mca", "mpi_yield_when_idle", "1"]
    return cmd


# glibc serves allocations >= 32 MiB (its largest mmap threshold) with a fresh mmap every time;
# OpenMPI's reductions allocate message-sized temporaries, so on this VM, where page faults are
# slow, every all-reduce / reduce-scatter of >= 32 MiB pays ~10 us per 4 KiB page (see (b)).
# Variants marked "no-mmap" run with malloc kept on the heap.
NO_MMAP = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "4294967295"}


def sh(cmd, timeout=900, env=None):
    t0 = time.time()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       env=dict(ENV, **(env or {})), timeout=timeout)
    if p.returncode != 0:
        sys.exit(f"command failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout[-3000:]}\n"
                 f"{p.stderr[-3000:]}")
    return p.stdout, time.time() - t0


class Runner:
    def __init__(self, a):
        self.a = a
        self.work = tempfile.mkdtemp(prefix="parallel_bench_")
        self.n = 0
        self.log = []  # every run: command and medians

    def trellis(self, np_, args, steps, env=None):
        """Run trellis train; return {metric: median over the steps after SKIP}."""
        self.n += 1
        out = os.path.join(self.work, f"run{self.n:03d}")
        if self.a.quick:
            args = shrink(args)
        cmd = mpirun(np_) + [self.a.trellis, "train"] + COMMON + args + [
            "--steps", str(steps), "--out", out]
        _, wall = sh(cmd, env=env)
        rows = []
        with open(os.path.join(out, "metrics.jsonl")) as f:
            for line in f:
                r = json.loads(line)
                if "step_ms" in r:
                    rows.append(r)
        shutil.rmtree(out, ignore_errors=True)
        timed = [r for r in rows if r["step"] > SKIP] or rows[-1:]
        med = {k: statistics.median(float(r[k]) for r in timed)
               for k in timed[0] if isinstance(timed[0][k], (int, float)) and k != "step"}
        show = " ".join([f"{k}={v}" for k, v in (env or {}).items()]
                        + [c for c in cmd if not c.startswith(self.work)])
        self.log.append({"cmd": show, "wall_s": round(wall, 1), "load": load(),
                         **{k: med[k] for k in ("step_ms", "comm_exposed_ms", "tp_comm_ms",
                                                "bubble") if k in med}})
        if self.a.verbose:
            print(f"  [{wall:5.1f}s load {load()}] {show} -> step_ms {med['step_ms']:.1f}",
                  file=sys.stderr, flush=True)
        return med

    def rotate(self, configs, steps, repeats=None):
        """Run every (name, np, args[, env]) config `repeats` times in rotation; median of the
        per-run medians. out[name]['runs'] keeps the per-run medians of step_ms."""
        per = {c[0]: [] for c in configs}
        for _ in range(repeats or self.a.repeats):
            for name, np_, args, *env in configs:
                per[name].append(self.trellis(np_, args, steps, env[0] if env else None))
        out = {}
        for name, runs in per.items():
            out[name] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            out[name]["runs"] = [round(r["step_ms"], 1) for r in runs]
        return out


def shrink(args):
    """--quick: a 4-layer model on 32-token sequences (same layouts, seconds per run)."""
    args = list(args)
    for flag, val in (("--seq-len", "32"), ("--n-layer", "4")):
        if flag in args:
            args[args.index(flag) + 1] = val
        else:
            args += [flag, val]
    return args


def mib(b):
    return f"{b / 2**20:.1f}"


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(str(c) for c in r) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------


def section_dp(R, a):
    base = ["--model", "baby", "--batch-size", "8", "--seq-len", "256", "--threads", "1"]
    one = ["--bucket-mb", "100000"]
    cfgs = [
        ("dp1", 1, base),
        ("dp2", 2, base + ["--dp", "2"]),
        ("dp2_onebucket", 2, base + ["--dp", "2"] + one),
        ("dp2_zero1", 2, base + ["--dp", "2", "--zero", "1"]),
        ("dp1_nommap", 1, base, NO_MMAP),
        ("dp2_nommap", 2, base + ["--dp", "2"], NO_MMAP),
        ("dp2_onebucket_nommap", 2, base + ["--dp", "2"] + one, NO_MMAP),
        ("dp2_zero1_nommap", 2, base + ["--dp", "2", "--zero", "1"], NO_MMAP),
    ]
    m = R.rotate(cfgs, a.steps, a.dp_repeats)
    # The peer, right after, same global batch, one thread per process.
    out, wall = sh([sys.executable, os.path.join(HERE, "torch_ddp_bench.py"), "--steps",
                    str(a.steps), "--repeats", str(a.dp_repeats), "--worlds", "1,2"]
                   + (["--seq", "32"] if a.quick else []), timeout=1800)
    lines = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    torch = lines[-1]
    torch["runs"] = {str(w): [round(r["ms"], 1) for r in lines[:-1] if r["world"] == w]
                     for w in (1, 2)}
    R.log.append({"cmd": "torch_ddp_bench.py", "wall_s": round(wall, 1), "load": load()})

    def eff(k1, k2):
        return m[k1]["step_ms"] / (2 * m[k2]["step_ms"])

    def hidden_from_steps(sfx):
        """1 - (t_default - t1/2) / (t_onebucket - t1/2): the step-time cost of DP
        communication over perfect scaling, with overlap vs with none."""
        half = m["dp1" + sfx]["step_ms"] / 2
        over_def = m["dp2" + sfx]["step_ms"] - half
        over_one = m["dp2_onebucket" + sfx]["step_ms"] - half
        return 1 - over_def / over_one if over_one > 0 else float("nan"), over_def, over_one

    def hidden_from_metric(sfx):
        ex_one = m["dp2_onebucket" + sfx]["comm_exposed_ms"]
        return 1 - m["dp2" + sfx]["comm_exposed_ms"] / ex_one if ex_one > 0 else float("nan")

    tt1, tt2 = torch["t_ms"]["1"], torch["t_ms"]["2"]
    teff = tt1 / (2 * tt2)
    tok = 8 * (32 if a.quick else 256)
    rows = []
    for key, label in [("dp1", "trellis dp=1 (1 thread)"),
                       ("dp2", "trellis dp=2 (2 × 1 thread), 25 MiB buckets"),
                       ("dp2_onebucket", "trellis dp=2, one bucket (--bucket-mb 100000)"),
                       ("dp2_zero1", "trellis dp=2 --zero 1")]:
        for sfx in ("", "_nommap"):
            r = m[key + sfx]
            d1 = "dp1" + sfx
            e = "—" if key == "dp1" else f"{eff(d1, key + sfx):.1%}"
            if key == "dp2":
                e = f"**{e}**"
            rows.append([label + (" [no-mmap]" if sfx else ""), f"{r['step_ms']:.0f}",
                         " / ".join(f"{x:.0f}" for x in r["runs"]), f"{r['compute_ms']:.0f}",
                         f"{r['tokens_per_s']:.0f}",
                         "—" if key == "dp1" else f"{r['comm_exposed_ms']:.1f}",
                         mib(r["mem_bytes"]), e])
    rows.append(["PyTorch DDP gloo world=1 (1 thread)", f"{tt1:.0f}",
                 " / ".join(f"{x:.0f}" for x in torch["runs"]["1"]), "—",
                 f"{tok / tt1 * 1e3:.0f}", "—", "—", "—"])
    rows.append(["PyTorch DDP gloo world=2 (2 × 1 thread)", f"{tt2:.0f}",
                 " / ".join(f"{x:.0f}" for x in torch["runs"]["2"]), "—",
                 f"{tok / tt2 * 1e3:.0f}", "—", "—", f"**{teff:.1%}**"])
    txt = table(["config (baby, global batch 8 × 256)", "step ms (median)", "per run",
                 "compute ms", "tokens/s", "comm exposed ms", "mem_bytes MiB (rank 0)",
                 "DP efficiency t1/(2·t2)"], rows)
    e0, e1 = eff("dp1", "dp2"), eff("dp1_nommap", "dp2_nommap")
    h0, o0d, o0o = hidden_from_steps("")
    h1, o1d, o1o = hidden_from_steps("_nommap")
    z0, z1 = m["dp2"]["mem_bytes"], m["dp2_zero1"]["mem_bytes"]
    txt += (
        f"\n\n[no-mmap] = run with {' '.join(f'{k}={v}' for k, v in NO_MMAP.items())} (glibc "
        f"malloc never mmaps; see (b))."
        f"\n\n- DP efficiency t1/(2·t2): trellis **{e0:.1%}** (target ≥ 95%; [no-mmap] "
        f"{e1:.1%}), PyTorch DDP gloo **{teff:.1%}**. Step time PyTorch/trellis: "
        f"{tt1 / m['dp1']['step_ms']:.2f}× at dp=1, {tt2 / m['dp2']['step_ms']:.2f}× at dp=2."
        f"\n- DP communication hidden behind backward, from comm_exposed_ms: "
        f"1 − exposed(25 MiB) / exposed(one bucket) = {hidden_from_metric(''):.1%} "
        f"([no-mmap] {hidden_from_metric('_nommap'):.1%}); from step times over t1/2 "
        f"(cost over perfect scaling, 25 MiB buckets vs one bucket): "
        f"{o0d:.0f} vs {o0o:.0f} ms → **{h0:.1%}** ([no-mmap] {o1d:.0f} vs {o1o:.0f} ms → "
        f"**{h1:.1%}**)."
        f"\n- ZeRO-1 at dp=2: mem_bytes {mib(z0)} → {mib(z1)} MiB (×{z1 / z0:.3f}: the AdamW "
        f"moments are halved, parameters and gradients stay whole; max over ranks "
        f"{mib(m['dp2_zero1']['mem_bytes_max'])} MiB). Step {m['dp2_zero1']['step_ms']:.0f} ms "
        f"vs {m['dp2']['step_ms']:.0f} at ZeRO-0 ([no-mmap] "
        f"{m['dp2_zero1_nommap']['step_ms']:.0f} vs {m['dp2_nommap']['step_ms']:.0f}); its "
        f"comm_exposed_ms covers the reduce-scatter only, the all-gather after the optimizer "
        f"lands in compute_ms.")
    return txt, {"trellis": m, "torch": torch, "efficiency": e0, "efficiency_nommap": e1,
                 "torch_efficiency": teff, "hidden_metric": hidden_from_metric(""),
                 "hidden_steps": h0, "hidden_steps_nommap": h1}


def section_allreduce(R, a):
    bench = os.path.join(os.path.dirname(a.trellis), "allreduce_bench")
    reps = "3" if a.quick else "9"
    txt, res = allreduce_table(R, bench, reps, None)
    t2, r2 = allreduce_table(R, bench, reps, NO_MMAP)
    txt += ("\n\nThe same with " + " ".join(f"{k}={v}" for k, v in NO_MMAP.items()) +
            " (glibc malloc never mmaps, so OpenMPI's message-sized temporaries are reused "
            "instead of page-faulted in on every call):\n\n" + t2)
    res["nommap"] = r2
    return txt, res


def allreduce_table(R, bench, reps, env):
    out, wall = sh(mpirun(2) + [bench, "--reps", reps], env=env)
    R.log.append({"cmd": " ".join([f"{k}={v}" for k, v in (env or {}).items()] + mpirun(2) +
                                  [bench, "--reps", reps]), "wall_s": round(wall, 1),
                  "load": load()})
    rows, big = [], []
    head = ""
    for line in out.splitlines():
        if line.startswith("#"):
            head = line.lstrip("# ")
            continue
        f = line.split()
        if not f or f[0] == "size":
            continue
        size = f"{f[0]} {f[1]}"
        vals = f[2:]
        rows.append([size] + vals)
        if f[1] == "MiB" and int(f[0]) >= 4 and vals[-1] != "-":
            big.append((float(vals[0]), float(vals[4]), float(vals[-1])))
    txt = f"{head}\n\n" + table(["size", "trellis µs", "trellis GB/s", "MPI_Allreduce µs",
                                  "MPI GB/s", "MPI_Iallreduce+Wait µs", "Iallreduce GB/s",
                                  "ratio mpi/trellis"], rows)
    res = {"rows": rows}
    if big:
        ratio = statistics.median(r for _, _, r in big)
        ratio_nb = statistics.median(nb / t for t, nb, _ in big)
        res["ratio_ge_4MiB"] = ratio
        res["ratio_nb_ge_4MiB"] = ratio_nb
        txt += (f"\n\n- At ≥ 4 MiB the median time ratio MPI_Allreduce / trellis is **{ratio:.2f}** "
                f"(1.00 = trellis as fast as raw blocking MPI; the bus-bandwidth ratio is the same "
                f"number); MPI_Iallreduce+Wait / trellis is {ratio_nb:.2f} (what trellis' poll "
                f"loop costs on top of the non-blocking collective it uses).")
    return txt, res


def section_tp(R, a):
    base = ["--model", "baby", "--batch-size", "8", "--seq-len", "256"]
    cfgs = [
        ("tp1_2thr", 1, base + ["--threads", "2"]),
        ("tp2", 2, base + ["--tp", "2", "--threads", "1"]),
        ("tp2_sp", 2, base + ["--tp", "2", "--threads", "1", "--sequence-parallel"]),
    ]
    m = R.rotate(cfgs, a.tp_steps)
    t1 = m["tp1_2thr"]["step_ms"]
    rows = []
    for name, label in [("tp1_2thr", "tp=1, 1 process × 2 threads"),
                        ("tp2", "tp=2, 2 processes × 1 thread"),
                        ("tp2_sp", "tp=2 + --sequence-parallel")]:
        r = m[name]
        rows.append([label, f"{r['step_ms']:.0f}", f"{r['tokens_per_s']:.0f}",
                     f"{t1 / r['step_ms']:.2f}", f"{r['tp_comm_ms']:.1f}",
                     f"{r['tp_comm_ms'] / r['step_ms']:.1%}", mib(r["mem_bytes"]),
                     mib(r["mem_bytes_max"]), mib(r["peak_rss_bytes_max"])])
    txt = table(["config (baby, 8 × 256)", "step ms", "tokens/s", "speed vs tp=1 2 thr",
                 "tp_comm ms", "TP comm share", "mem_bytes MiB rank 0", "mem_bytes max MiB",
                 "peak RSS max MiB"], rows)
    mem1, mem2 = m["tp1_2thr"]["mem_bytes"], m["tp2"]["mem_bytes_max"]
    txt += (f"\n\n- Per-rank mem_bytes tp=2 / tp=1 = {mem2 / mem1:.3f} (ideal 0.5; the embeddings, "
            f"LayerNorms and row-parallel biases are replicated)."
            f"\n- tp=2 throughput vs one process with 2 threads: {t1 / m['tp2']['step_ms']:.2f}× "
            f"(sequence parallel: {t1 / m['tp2_sp']['step_ms']:.2f}×).")
    return txt, m


def section_pp(R, a):
    steps = a.pp_steps
    base = ["--model", "baby", "--n-layer", "8", "--seq-len", "64", "--threads", "1"]
    b = 2
    ms = [4, 8, 16]
    cfgs = []
    for pp, sched, V in [(2, "1f1b", 1), (2, "interleaved", 2), (4, "1f1b", 1)]:
        for m_ in ms:
            args = base + ["--pp", str(pp), "--batch-size", str(m_ * b), "--micro-batch-size",
                           str(b), "--schedule", sched]
            if V > 1:
                args += ["--virtual-stages", str(V)]
            cfgs.append((f"pp{pp}_{sched}{V}_m{m_}", pp, args))
    res = {}
    rows = []
    for r_ in range(1):  # bubbles are ratios: one pass, configs in order
        for name, np_, args in cfgs:
            res[name] = R.trellis(np_, args, steps)
    for name, np_, args in cfgs:
        r = res[name]
        pp = np_
        sched = args[args.index("--schedule") + 1]
        V = int(args[args.index("--virtual-stages") + 1]) if "--virtual-stages" in args else 1
        m_ = int(args[args.index("--batch-size") + 1]) // b
        note = " (4 ranks on 2 cores)" if pp > CORES else ""
        rows.append([f"{pp}{note}", sched + (f" V={V}" if V > 1 else ""), m_,
                     f"{r['bubble']:.3f}", f"{r['bubble_theory']:.3f}",
                     f"{r['bubble'] / r['bubble_theory']:.2f}", f"{r['step_ms']:.0f}",
                     f"{r['peak_micro_batches']:.0f}"])
    txt = table(["pp", "schedule", "m", "bubble measured", "bubble theory", "measured/theory",
                 "step ms", "peak micro-batches"], rows)

    # Activation memory, first stage: 1F1B keeps <= pp micro-batches alive, GPipe all m.
    mem_base = ["--model", "baby", "--n-layer", "8", "--seq-len", "256", "--threads", "1",
                "--pp", "4", "--batch-size", "16", "--micro-batch-size", "1"]
    mem = {}
    for sched in ["1f1b", "gpipe"]:
        mem[sched] = R.trellis(4, mem_base + ["--schedule", sched], a.mem_steps)
    rows = [[s, f"{mem[s]['peak_micro_batches']:.0f}", mib(mem[s]["peak_rss_bytes_max"]),
             mib(mem[s]["peak_rss_bytes"]), f"{mem[s]['bubble']:.3f}",
             f"{mem[s]['bubble_theory']:.3f}", f"{mem[s]['step_ms']:.0f}"] for s in mem]
    shape = "32 tokens, 4 layers (1" if a.quick else "256 tokens, 8 layers (2"
    txt += f"\n\npp=4, m=16, micro-batch 1 × {shape} per stage):\n\n" + table(
        ["schedule", "peak micro-batches (max over stages = first stage)",
         "peak RSS max over ranks MiB", "peak RSS rank 0 MiB", "bubble", "bubble theory",
         "step ms"], rows)
    d = mem["gpipe"]["peak_rss_bytes_max"] - mem["1f1b"]["peak_rss_bytes_max"]
    txt += (f"\n\n- GPipe − 1F1B peak RSS (first stage): {mib(d)} MiB for "
            f"{mem['gpipe']['peak_micro_batches'] - mem['1f1b']['peak_micro_batches']:.0f} more "
            f"micro-batches alive.")
    res["memory"] = mem
    return txt, res


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trellis", default=os.path.join(ROOT, "build", "trellis"))
    ap.add_argument("--sections", default="a,b,c,d", help="subset of a,b,c,d")
    ap.add_argument("--quick", action="store_true", help="smoke run: few steps, one repeat")
    ap.add_argument("--steps", type=int, default=12, help="steps per DP run (2 warm-ups incl.)")
    ap.add_argument("--tp-steps", type=int, default=10)
    ap.add_argument("--pp-steps", type=int, default=8)
    ap.add_argument("--mem-steps", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2, help="rotations of (c)")
    ap.add_argument("--dp-repeats", type=int, default=3, help="rotations of (a)")
    ap.add_argument("--json", help="also write all medians and run commands here")
    ap.add_argument("--verbose", action="store_true", help="one stderr line per run")
    a = ap.parse_args()
    if a.quick:
        a.steps, a.tp_steps, a.pp_steps, a.mem_steps, a.repeats, a.dp_repeats = 4, 4, 4, 3, 1, 1
    if not os.access(a.trellis, os.X_OK):
        sys.exit(f"{a.trellis}: not an executable (build first)")

    R = Runner(a)
    results = {}
    t0 = time.time()
    print(f"# trellis parallel benchmarks — {time.strftime('%Y-%m-%d %H:%M')}, {CORES} cores, "
          f"load {load()}{' (--quick)' if a.quick else ''}\n", flush=True)
    sections = [("a", "DP scaling (baby, global batch 8 × 256)", section_dp),
                ("b", "all-reduce bus bandwidth: trellis communicator vs MPI", section_allreduce),
                ("c", "Tensor parallelism (baby, 8 × 256)", section_tp),
                ("d", "Pipeline bubble and activation memory", section_pp)]
    try:
        for key, title, fn in sections:
            if key not in a.sections.split(","):
                continue
            ts = time.time()
            l0 = load()
            txt, res = fn(R, a)
            results[key] = res
            print(f"## ({key}) {title}\n\n{txt}\n\n_{time.time() - ts:.0f} s, load {l0} → "
                  f"{load()}_\n", flush=True)
    finally:
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"results": results, "runs": R.log}, f, indent=1, default=str)
        shutil.rmtree(R.work, ignore_errors=True)
    print(f"_total {time.time() - t0:.0f} s_")


if __name__ == "__main__":
    main()
