#!/usr/bin/env python3
"""DP across two "nodes" over real TCP: scaling and what overlapping buckets buys at 1 and 10 Gbit/s.

Two network namespaces joined by a bridge (scripts/netns_cluster.sh, one rank per node), mpirun
over the TCP transport only, each link shaped in both directions by tc tbf. `baby` (10.8 M
parameters, 41 MiB of gradients) at a global batch of 8 × 256 tokens, one thread per rank:

  dp1                one process (no MPI), the t1 of the efficiency t1 / (2 t2)
  shm                mpirun -np 2 on one host (shared memory), for reference
  <link> buckets     dp=2 across the nodes, buckets (default 25 MiB, --bucket-mb) launched
                     during backward
  <link> one bucket  the same with --bucket-mb 100000: one all-reduce after backward, no overlap

for <link> in: unshaped veth, 10 Gbit/s, 1 Gbit/s, 1 Gbit/s again with OpenMPI's TCP progress
thread (--mca btl_tcp_progress_thread 1: the sockets are served while the rank computes), and
1 Gbit/s again without trellis's own progress thread (TRELLIS_MPI_PROGRESS_US=0: a non-blocking
all-reduce then advances only inside the MPI_Test calls trellis makes between backward blocks).
Overlap gain = t(one bucket) / t(buckets);
hidden = 1 − (t(buckets) − t1/2) / (t(one bucket) − t1/2), the share of the communication cost
over perfect scaling that the buckets hide. Medians over the steps after the first 2, configs in
rotation (--repeats), median of the per-run medians. Bytes per step from the veth counters.

  /usr/bin/python3 bench/netns_bench.py [--trellis build/trellis] [--steps 8] [--repeats 2]

Needs root (namespaces) and the other engineers' consent: it waits for /tmp/bench.lock to be
gone, holds it while timing, and removes it after.
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
SCRIPT = os.path.join(ROOT, "scripts", "netns_cluster.sh")
LOCK = "/tmp/bench.lock"
SKIP = 2
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
BASE = ["--model", "baby", "--batch-size", "8", "--seq-len", "256", "--threads", "1",
        "--val-every", "0", "--tensorboard", "false", "--quiet", "--seed", "1337",
        "--precision", "fp32"]
ONE_BUCKET = ["--bucket-mb", "100000"]


def load():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def sh(cmd, timeout):
    p = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=timeout)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    return p.stdout


class Lock:
    def __enter__(self):
        while True:
            try:
                os.close(os.open(LOCK, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                return self
            except FileExistsError:
                print(f"waiting for {LOCK} to go ...", file=sys.stderr, flush=True)
                time.sleep(10)

    def __exit__(self, *exc):
        os.unlink(LOCK)


def veth_bytes(veths):
    total = 0
    for v in veths:
        with open(f"/sys/class/net/{v}/statistics/rx_bytes") as f:
            total += int(f.read())
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trellis", default=os.path.join(ROOT, "build", "trellis"))
    ap.add_argument("--steps", type=int, default=8, help="steps per run (2 warm-ups incl.)")
    ap.add_argument("--repeats", type=int, default=2, help="rotations over the configs")
    ap.add_argument("--rates", default="none,10gbit,1gbit", help="links to measure (tc rates)")
    ap.add_argument("--progress-thread-rates", default="1gbit",
                    help="links measured again with btl_tcp_progress_thread 1")
    ap.add_argument("--bucket-mb", type=int, default=0,
                    help="bucket size of the 'buckets' runs (default: trellis's, 25 MiB)")
    ap.add_argument("--no-progress-rates", default="1gbit",
                    help="links measured again with trellis's progress thread off")
    ap.add_argument("--json", help="also write every run here")
    a = ap.parse_args()
    trellis = os.path.abspath(a.trellis)
    name = f"b{os.getpid()}"
    work = tempfile.mkdtemp(prefix="netns_bench_")
    configs = [("dp1", None, [])]
    buckets = ["--bucket-mb", str(a.bucket_mb)] if a.bucket_mb else []
    configs += [("shm buckets", "shm", buckets), ("shm one bucket", "shm", ONE_BUCKET)]
    links = a.rates.split(",") + [r + "+pt" for r in a.progress_thread_rates.split(",") if r]
    links += [r + "+off" for r in a.no_progress_rates.split(",") if r]
    for rate in links:
        configs += [(f"{rate} buckets", rate, buckets), (f"{rate} one bucket", rate, ONE_BUCKET)]
    per = {c[0]: [] for c in configs}
    log = []
    print(f"# netns_bench — {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, "
          f"load {load()}, {a.steps} steps × {a.repeats} rounds", flush=True)
    t_start = time.time()
    with Lock():
        sh([SCRIPT, "up", "2", "--name", name, "--slots", "1"], 120)
        try:
            veths = [line.split()[2] for line in open(f"/run/trellis-netns/{name}/nodes")]
            for r in range(a.repeats):
                for label, link, extra in configs:
                    out = os.path.join(work, f"run{len(log):03d}")
                    args = [trellis, "train"] + BASE + extra + ["--steps", str(a.steps),
                                                                 "--out", out]
                    if link is None:
                        cmd = args
                    elif link == "shm":
                        cmd = ["mpirun", "-np", "2"] + args + ["--dp", "2"]
                    else:
                        rate, _, variant = link.partition("+")
                        sh([SCRIPT, "shape", "--name", name, "--rate", rate], 60)
                        opts = {"pt": ["--mca", "btl_tcp_progress_thread", "1"],
                                "off": ["-x", "TRELLIS_MPI_PROGRESS_US=0"]}.get(variant, [])
                        cmd = [SCRIPT, "run", "--name", name, "--timeout", "600", "--", "-np",
                               "2"] + opts + args + ["--dp", "2"]
                    b0, t0, l0 = veth_bytes(veths), time.time(), load()
                    sh(cmd, 700)
                    moved = veth_bytes(veths) - b0
                    rows = [json.loads(x) for x in open(os.path.join(out, "metrics.jsonl"))]
                    rows = [x for x in rows if "step_ms" in x and x["step"] > SKIP]
                    med = {k: statistics.median(x[k] for x in rows)
                           for k in ("step_ms", "comm_exposed_ms", "compute_ms")}
                    med["mb_per_step"] = moved / a.steps / 1e6
                    per[label].append(med)
                    log.append({"config": label, "round": r, "cmd": " ".join(cmd),
                                "wall_s": round(time.time() - t0, 1), "load": l0, **med})
                    print(f"  [{time.time() - t0:5.1f}s load {l0}] {label}: step "
                          f"{med['step_ms']:.0f} ms, exposed {med['comm_exposed_ms']:.0f} ms, "
                          f"{med['mb_per_step']:.1f} MB/step on the veths", file=sys.stderr,
                          flush=True)
                    shutil.rmtree(out, ignore_errors=True)
        finally:
            subprocess.run([SCRIPT, "down", "--name", name])
            shutil.rmtree(work, ignore_errors=True)
    m = {k: {f: statistics.median(x[f] for x in v) for f in v[0]} | {
        "runs": [round(x["step_ms"]) for x in v]} for k, v in per.items()}
    t1 = m["dp1"]["step_ms"]

    def link_name(link):
        link, _, variant = link.partition("+")
        extra = {"pt": " + TCP progress thread", "off": ", no progress thread"}.get(variant, "")
        return {"shm": "one host, shared memory", "none": "veth, unshaped"}.get(
            link, f"veth, {link.replace('gbit', ' Gbit/s')}") + extra

    print("\n| link (dp=2, 1 rank per node) | buckets: step ms (runs) | one bucket: step ms (runs) "
          "| DP efficiency t1/(2·t2), buckets | one bucket | overlap gain t(one)/t(buckets) "
          "| hidden | exposed ms buckets / one | MB/step sent over both links |")
    print("|---|---|---|---|---|---|---|---|---|")
    for _, link, extra in configs[1::2]:
        d, o = m[f"{link} buckets"], m[f"{link} one bucket"]
        half = t1 / 2
        hidden = 1 - (d["step_ms"] - half) / (o["step_ms"] - half) if o["step_ms"] > half \
            else float("nan")
        mb = "—" if link == "shm" else f"{d['mb_per_step']:.0f} / {o['mb_per_step']:.0f}"
        print(f"| {link_name(link)} | {d['step_ms']:.0f} ({' / '.join(map(str, d['runs']))}) | "
              f"{o['step_ms']:.0f} ({' / '.join(map(str, o['runs']))}) | "
              f"{t1 / (2 * d['step_ms']):.1%} | {t1 / (2 * o['step_ms']):.1%} | "
              f"{o['step_ms'] / d['step_ms']:.2f}× | {hidden:.0%} | "
              f"{d['comm_exposed_ms']:.0f} / {o['comm_exposed_ms']:.0f} | {mb} |")
    print(f"\ndp1 (one process, 1 thread): {t1:.0f} ms "
          f"({' / '.join(map(str, m['dp1']['runs']))}). "
          f"_{time.time() - t_start:.0f} s, load {load()} at the end_")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"medians": m, "runs": log}, f, indent=1)


if __name__ == "__main__":
    main()
