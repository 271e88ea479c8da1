#!/usr/bin/env python3
"""trellis vs PyTorch-eager training throughput on the CPU, same machine, same run.

For each configuration and precision the two sides run alternately (trellis, torch, trellis,
..., --repeats times each), so load from other jobs on the machine hits both alike:

  baby  6L/6H/384, batch 8 x 256, vocab 256: trellis' built-in byte corpus
  gpt2  12L/12H/768 (124M), batch 4 x 64, vocab 50257: a data directory prepared from
        /usr/share/common-licenses with the GPT-2 tokenizer (tests/data/gpt2)
  gpt2_long  the same model at batch 2 x 1024, its full context (issue 25's third shape; the
        PyTorch peer's attention stores the T x T probabilities: Debian's torch 1.13 has no
        scaled_dot_product_attention)

Both train with AdamW (weight decay on 2-D weights, grad clip 1.0) and fp32 master weights.
--precision fp32,bf16 (default both): fp32 runs everything in float32; bf16 is mixed precision,
`trellis train --precision bf16` against PyTorch's torch.cpu.amp.autocast(bfloat16) (see
bench/torch_gpt_bench.py). The trellis ms/step is the median of metrics.jsonl's step_ms over the
steps after the first 2; torch's comes from bench/torch_gpt_bench.py (median after 2 warm-ups).
Over repeats, the median of the per-run medians is reported. Prints markdown: the command line,
the 1-minute load average at start and end, the setup each side ran with, the thread probe, one
row per config and precision (ms/step, tok/s, trellis/torch time) and, when both precisions
ran, each side's bf16 speedup over its fp32.

PyTorch gets the setup a careful user would give it:
  * an optimized BLAS: Debian's python3-torch runs on netlib's reference BLAS unless
    libopenblas0-pthread is installed; this script refuses to run (exit 2) in that case, run
    bench/setup_peer.sh first;
  * OpenBLAS's kernels for this CPU: --openblas-coretype auto (default) removes
    OPENBLAS_CORETYPE from torch's environment, so OpenBLAS picks its kernels by CPUID (some
    environments pin the twice-slower Haswell kernels; trellis' oneDNN GEMM dispatches by CPUID
    anyway); `env` keeps the environment's value, any other value is set as is;
  * its best thread setup: before the measured runs of each config and precision, a short probe
    (--probe-steps) runs every combination of torch threads {1, N} x OpenBLAS threads {1, N}
    (N = --threads; torch.set_num_threads(t) with OMP_NUM_THREADS=t, OPENBLAS_NUM_THREADS=b),
    separately for fp32 and bf16, and the fastest is used (--torch-setup picks one instead). On
    2 cores fp32's best is often 1 torch thread with 2 OpenBLAS threads (OpenBLAS's pthreads and
    torch's OpenMP pool would otherwise compete for the cores), while autocast's GEMMs run in
    oneDNN on torch's own threads. The variables are set in the subprocess's environment, so
    they hold before torch is imported, and each run checks that OpenBLAS reports the thread
    count asked for;
  * glibc malloc without mmap and trimming (MALLOC_MMAP_MAX_=0,
    MALLOC_TRIM_THRESHOLD_=4294967295), which trellis sets for itself with mallopt.
trellis gets --threads threads.

  bench/setup_peer.sh    # once
  /usr/bin/python3 bench/run_bench.py --steps 10 --repeats 3 [--configs baby,gpt2,gpt2_long] \\
      [--precision fp32,bf16]
  /usr/bin/python3 bench/run_bench.py --quick   # 6-step runs, 4-step probes, 1 repeat
"""

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SKIP = 2  # warm-up steps left out on both sides
PRECISIONS = ("fp32", "bf16")

CONFIGS = {
    "baby": dict(label="baby (6L/384) 8x256", preset="baby", batch=8, seq=256, data=None),
    "gpt2": dict(label="gpt2 124M 4x64", preset="gpt2", batch=4, seq=64, data="gpt2"),
    "gpt2_long": dict(label="gpt2 124M 2x1024", preset="gpt2", batch=2, seq=1024, data="gpt2"),
}

# glibc malloc for the torch process: no mmap for large blocks, no trimming (trellis: mallopt).
TORCH_MALLOC_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "4294967295"}


def torch_setups(threads):
    """{key: (label, torch.set_num_threads, OMP_NUM_THREADS, OPENBLAS_NUM_THREADS)}: every
    combination of torch threads {1, threads} x OpenBLAS threads {1, threads}."""
    counts = sorted({1, threads})
    return {f"t{t}-b{b}": (f"torch {t} / OpenBLAS {b}", t, t, b) for t in counts for b in counts}


def sh(cmd, stderr=False, **kw):
    """stdout of cmd (and its stderr with stderr=True); exits if cmd fails."""
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    if p.returncode != 0:
        sys.exit(f"command failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout}\n{p.stderr}")
    return (p.stdout, p.stderr) if stderr else p.stdout


def torch_env(setup, coretype):
    """The torch subprocess's environment for one thread setup (see torch_setups)."""
    env = dict(os.environ, **TORCH_MALLOC_ENV)
    _, _, omp, blas = setup
    env["OMP_NUM_THREADS"] = str(omp)
    env["OPENBLAS_NUM_THREADS"] = str(blas)
    if coretype == "auto":
        env.pop("OPENBLAS_CORETYPE", None)
    elif coretype != "env":
        env["OPENBLAS_CORETYPE"] = coretype
    return env


def check_torch_blas(python, coretype):
    """Exit 2 with one line if torch would run on netlib's reference BLAS; else its BLAS info."""
    env = torch_env(("", 1, 1, 1), coretype)
    info = json.loads(sh([python, os.path.join(HERE, "torch_gpt_bench.py"), "--blas-info"],
                         env=env).strip().splitlines()[-1])
    if info["reference"]:
        where = info["sgemm_from"] or ", ".join(info["blas_libs"])
        print(f"run_bench.py: error: PyTorch ({python}) would run on netlib's reference BLAS "
              f"({where}); install OpenBLAS with bench/setup_peer.sh", file=sys.stderr)
        sys.exit(2)
    return info


def trellis_has_precision(trellis):
    return "--precision" in sh([trellis, "train", "--help"])


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


def run_trellis(trellis, cfg, steps, threads, work, data, precision):
    out = os.path.join(work, "trellis_out")
    shutil.rmtree(out, ignore_errors=True)
    cmd = [trellis, "train", "--model", cfg["preset"], "--batch-size", str(cfg["batch"]),
           "--seq-len", str(cfg["seq"]), "--steps", str(steps), "--val-every", "0",
           "--val-batches", "1", "--tensorboard=false", "--quiet=true", "--out", out,
           "--threads", str(threads)]
    if precision:  # None: this trellis has no --precision flag (fp32 only)
        cmd += ["--precision", precision]
    if data:
        cmd += ["--data", data]
    _, err = sh(cmd, stderr=True)
    # trellis falls back to fp32 with a notice on CPUs without AVX512-BF16: not a bf16 run.
    notices = [ln for ln in err.splitlines() if ln.startswith("trellis:") and "bf16" in ln]
    if precision == "bf16" and notices:
        sys.exit(f"run_bench.py: error: trellis did not run bf16: {notices[0]}")
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


def run_torch(python, cfg, steps, setup, precision, coretype):
    _, threads, omp, blas = setup
    out = sh([python, os.path.join(HERE, "torch_gpt_bench.py"), "--preset", cfg["preset"],
              "--batch", str(cfg["batch"]), "--seq", str(cfg["seq"]), "--steps", str(steps),
              "--threads", str(threads), "--precision", precision],
             env=torch_env(setup, coretype))
    r = json.loads(out.strip().splitlines()[-1])
    env = r["env"]
    if (r["torch_threads"], env["OMP_NUM_THREADS"], env["OPENBLAS_NUM_THREADS"]) != (
            threads, str(omp), str(blas)) or r["precision"] != precision or (
            r["openblas_threads"] is not None and r["openblas_threads"] != blas):
        sys.exit(f"torch_gpt_bench.py ran another setup than asked: {out}")
    return dict(ms=r["ms_per_step"], tok_s=r["tokens_per_s"], info=r)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=None,
                    help="steps per run, 2 warm-ups included (default 10, --quick 6)")
    ap.add_argument("--repeats", type=int, default=None,
                    help="runs of each side per config and precision (default 1)")
    ap.add_argument("--quick", action="store_true",
                    help="a run that fits a busy afternoon: --steps 6 --probe-steps 4 --repeats 1 "
                         "unless given")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--configs", default="baby,gpt2,gpt2_long",
                    help="comma list of: baby, gpt2, gpt2_long")
    ap.add_argument("--precision", default="fp32,bf16", help="comma list of: fp32, bf16")
    ap.add_argument("--torch-setup", default="probe",
                    help="torch threads: probe every setup (default), or use one, tT-bB: T torch "
                         "(and OpenMP) threads, B OpenBLAS threads, each 1 or --threads")
    ap.add_argument("--probe-steps", type=int, default=None,
                    help="steps per probe run of each torch thread setup, 2 warm-ups included "
                         "(default 5, --quick 4)")
    ap.add_argument("--openblas-coretype", default="auto",
                    help="OPENBLAS_CORETYPE for torch: auto (unset: OpenBLAS detects the CPU), "
                         "env (keep the environment's), or a core name such as SkylakeX")
    ap.add_argument("--trellis", default=os.path.join(ROOT, "build", "trellis"))
    ap.add_argument("--python", default="/usr/bin/python3", help="python with torch")
    ap.add_argument("--work", default="", help="scratch directory (default: a temp dir)")
    a = ap.parse_args()
    quick = dict(steps=6, probe_steps=4, repeats=1) if a.quick else {}
    for key, default in dict(steps=10, probe_steps=5, repeats=1).items():
        if getattr(a, key) is None:
            setattr(a, key, quick.get(key, default))
    if a.repeats < 1:
        ap.error("--repeats must be at least 1")
    if a.steps <= SKIP:
        ap.error(f"--steps must exceed the {SKIP} warm-up steps")
    if a.probe_steps <= SKIP:
        ap.error(f"--probe-steps must exceed the {SKIP} warm-up steps")
    if a.threads < 1:
        ap.error("--threads must be at least 1")
    names = [c for c in a.configs.split(",") if c]
    for c in names:
        if c not in CONFIGS:
            ap.error(f"unknown config {c!r} (choose from {', '.join(CONFIGS)})")
    precisions = [p for p in a.precision.split(",") if p]
    for p in precisions:
        if p not in PRECISIONS:
            ap.error(f"unknown precision {p!r} (choose from {', '.join(PRECISIONS)})")
    if not names or not precisions:
        ap.error("nothing to run")
    setups = torch_setups(a.threads)
    if a.torch_setup != "probe" and a.torch_setup not in setups:
        ap.error(f"--torch-setup {a.torch_setup!r}: choose probe or one of {', '.join(setups)}")
    blas = check_torch_blas(a.python, a.openblas_coretype)
    if not os.access(a.trellis, os.X_OK):
        sys.exit(f"run_bench.py: error: no trellis binary at {a.trellis} (cmake --build build)")
    has_precision = trellis_has_precision(a.trellis)
    if "bf16" in precisions and not has_precision:
        print(f"run_bench.py: error: {a.trellis} has no --precision flag (rebuild it, or pass "
              "--precision fp32)", file=sys.stderr)
        sys.exit(2)

    command = shlex.join(getattr(sys, "orig_argv", [sys.executable] + sys.argv))
    load_start = os.getloadavg()[0]
    work = a.work or tempfile.mkdtemp(prefix="trellis_bench_")
    os.makedirs(work, exist_ok=True)

    def log(msg):
        print(f"# {msg}", file=sys.stderr, flush=True)

    results, probes = [], []
    for name in names:
        cfg = CONFIGS[name]
        data = prepare_gpt2_data(a.trellis, work) if cfg["data"] == "gpt2" else None
        for prec in precisions:
            if a.torch_setup != "probe":
                best = a.torch_setup
            elif len(setups) == 1:
                best = next(iter(setups))
            else:
                times = {}
                for key, setup in setups.items():
                    times[key] = run_torch(a.python, cfg, a.probe_steps, setup, prec,
                                           a.openblas_coretype)["ms"]
                    log(f"{name} {prec} probe {setup[0]}: {times[key]:.1f} ms/step")
                best = min(times, key=times.get)
                probes.append(dict(label=cfg["label"], prec=prec, times=times, best=best))
            setup = setups[best]
            tr, to = [], []
            for r in range(a.repeats):
                tr.append(run_trellis(a.trellis, cfg, a.steps, a.threads, work, data,
                                      prec if has_precision else None))
                log(f"{name} {prec} run {r + 1}/{a.repeats} trellis: {tr[-1]['ms']:.1f} ms/step")
                to.append(run_torch(a.python, cfg, a.steps, setup, prec, a.openblas_coretype))
                log(f"{name} {prec} run {r + 1}/{a.repeats} torch:   {to[-1]['ms']:.1f} ms/step "
                    f"({setup[0]})")
            med = lambda rs, k: statistics.median(x[k] for x in rs)  # noqa: E731
            mfus = [x["mfu"] for x in tr if x["mfu"] is not None]
            results.append(dict(name=name, label=cfg["label"], prec=prec, setup=setup[0],
                                t_ms=med(tr, "ms"), p_ms=med(to, "ms"),
                                t_tok=med(tr, "tok_s"), p_tok=med(to, "tok_s"),
                                mfu=statistics.median(mfus) if mfus else None,
                                info=to[-1]["info"]))
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)
    load_end = os.getloadavg()[0]

    info = results[0]["info"]
    core_env = {"auto": "OPENBLAS_CORETYPE unset for it, OpenBLAS detects the CPU",
                "env": f"OPENBLAS_CORETYPE from the environment: "
                       f"{os.environ.get('OPENBLAS_CORETYPE', 'unset')}"}.get(
        a.openblas_coretype, f"OPENBLAS_CORETYPE={a.openblas_coretype} set for it")
    if blas["openblas_config"]:
        blas_text = f"{info['openblas_config']} (core {info['openblas_core']}; {core_env})"
    else:
        blas_text = blas["sgemm_from"] or "its bundled BLAS"
    malloc = " ".join(f"{k}={v}" for k, v in TORCH_MALLOC_ENV.items())
    print("\n## trellis vs PyTorch eager, one process\n")
    print(f"- command: `{command}`")
    print(f"- 1-minute load average: {load_start:.2f} at start, {load_end:.2f} at end")
    cores = os.cpu_count() or 1
    if max(load_start, load_end) > cores + 0.5:
        # Measured 2026-12-05 at load 9-15 on 2 cores: trellis's two OpenMP threads wait at every
        # barrier for a descheduled peer (a baby step 11x its idle time) while a one-thread torch
        # lost 3x, so such a run ranks the schedulers, not the engines.
        print(f"- **warning: load above the machine's {cores} cores; the ratios below measure "
              "contention with other jobs, not the engines; rerun on an idle machine**")
    print(f"- {a.steps} steps per run ({a.steps - SKIP} timed), {a.repeats} run(s) per side, "
          "trellis and torch alternating; median of the per-run medians; AdamW, fp32 master "
          "weights")
    print(f"- trellis: `{a.trellis}`, {a.threads} thread(s)"
          + ("" if has_precision else ", no --precision flag (fp32)"))
    print(f"- PyTorch {info['torch']} (`{a.python}`): {blas_text}; {malloc}; bf16 = "
          "torch.cpu.amp.autocast(dtype=torch.bfloat16) around forward and loss")
    if a.torch_setup != "probe":
        print(f"- torch thread setup fixed by --torch-setup: {setups[a.torch_setup][0]}")
    elif probes:
        print(f"- torch thread setup: the fastest of a {a.probe_steps}-step probe "
              f"({a.probe_steps - SKIP} timed; ms/step below, the winner in bold) per config "
              "and precision\n")
        keys = list(setups)
        print("| config | precision | " + " | ".join(setups[k][0] for k in keys) + " | used |")
        print("|---|---|" + "---:|" * len(keys) + "---|")
        for p in probes:
            cells = [(f"**{p['times'][k]:.1f}**" if k == p["best"] else f"{p['times'][k]:.1f}")
                     for k in keys]
            print(f"| {p['label']} | {p['prec']} | " + " | ".join(cells)
                  + f" | {setups[p['best']][0]} |")
    print("\n| config | precision | trellis ms/step | trellis tok/s | torch ms/step | torch tok/s "
          "| trellis speed ÷ torch | torch threads | trellis MFU |")
    print("|---|---|---:|---:|---:|---:|---:|---|---:|")
    for r in results:
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a"
        print(f"| {r['label']} | {r['prec']} | {r['t_ms']:.1f} | {r['t_tok']:.0f} | "
              f"{r['p_ms']:.1f} | {r['p_tok']:.0f} | {r['p_ms'] / r['t_ms']:.2f}× | {r['setup']} "
              f"| {mfu} |")
    by = {(r["name"], r["prec"]): r for r in results}
    both = [n for n in names if (n, "fp32") in by and (n, "bf16") in by]
    if both:
        print("\nbf16 speedup over fp32 (fp32 ms/step ÷ bf16 ms/step), each side against "
              "itself:\n")
        print("| config | trellis fp32 ms | trellis bf16 ms | trellis bf16 speedup "
              "| torch fp32 ms | torch bf16 ms | torch bf16 speedup |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for n in both:
            f, b = by[(n, "fp32")], by[(n, "bf16")]
            print(f"| {f['label']} | {f['t_ms']:.1f} | {b['t_ms']:.1f} | "
                  f"{f['t_ms'] / b['t_ms']:.2f}× | {f['p_ms']:.1f} | {b['p_ms']:.1f} | "
                  f"{f['p_ms'] / b['p_ms']:.2f}× |")


if __name__ == "__main__":
    main()
