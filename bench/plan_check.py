"""The planner against trellis's own measured steps on this machine (issue 14).

Calibrates this machine for one rank and for two (`trellis calibrate`, as the ranks will run),
asks `trellis plan --json` for every layout of one run (model, batch, sequence length), then
trains each layout of LAYOUTS for a few steps and compares the measured median step time and
allocator peak with the prediction. Also checks the planner's first choice of each world size
against the fastest layout measured there.

usage: python3 bench/plan_check.py TRELLIS_BIN OUT_DIR [--steps N] [--model M] [--repeat R]
  [--cluster-rate RATE]
With --cluster-rate (e.g. 1gbit; run as root) only world 2 is checked, and across "nodes": a
2-node network-namespace cluster (scripts/netns_cluster.sh) with one rank per node, its links
shaped to RATE, calibrated across it and planned with --ranks-per-node 1. Its ranks run one
thread each: the "nodes" share this machine's cores, and each would take them all.
--repeat R measures every layout in each of R passes over the list (the machine's speed drifts
over minutes; passes spread that over all layouts) and takes the median of all its steps.
Run it on a quiet machine (`flock /tmp/bench.lock`); it prints the load average it saw and
writes OUT_DIR/plan_check.json and a Markdown table for bench/RESULTS.md."""
import argparse
import json
import os
import shutil
import statistics
import subprocess

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts",
                      "netns_cluster.sh")

# (world, train flags): world 1 and 2, ZeRO 0-3, recompute, tp (+sp), the four pp schedules,
# micro-batches.
LAYOUTS = [
    (1, "--micro-batch-size 8"),
    (1, "--micro-batch-size 2"),
    (1, "--micro-batch-size 8 --recompute selective"),
    (1, "--micro-batch-size 4 --recompute full"),
    (2, "--dp 2 --micro-batch-size 4"),
    (2, "--dp 2 --micro-batch-size 1"),
    (2, "--dp 2 --micro-batch-size 4 --zero 1"),
    (2, "--dp 2 --micro-batch-size 2 --zero 2"),
    (2, "--dp 2 --micro-batch-size 4 --zero 3"),
    (2, "--dp 2 --micro-batch-size 4 --recompute selective"),
    (2, "--tp 2 --micro-batch-size 8"),
    (2, "--tp 2 --sequence-parallel --micro-batch-size 4 --recompute full"),
    (2, "--pp 2 --schedule 1f1b --micro-batch-size 2"),
    (2, "--pp 2 --schedule gpipe --micro-batch-size 1"),
    (2, "--pp 2 --schedule interleaved --virtual-stages 3 --micro-batch-size 2"),
    (2, "--pp 2 --schedule zb1 --micro-batch-size 2"),
]


def flags_of(c):
    """train flags of a planner candidate (its JSON)."""
    f = f"--dp {c['dp']} --tp {c['tp']} --pp {c['pp']} --micro-batch-size {c['micro_batch']}"
    if c["pp"] > 1:
        f += f" --schedule {c['schedule']} --virtual-stages {c['virtual_stages']}"
    if c["zero"]:
        f += f" --zero {c['zero']}"
    if c["recompute"] != "none":
        f += f" --recompute {c['recompute']}"
    if c["sequence_parallel"]:
        f += " --sequence-parallel"
    return f


def key_of_flags(world, flags, batch):
    """The planner's layout fields a set of train flags selects."""
    a = flags.split()
    get = lambda name, default: a[a.index(name) + 1] if name in a else default
    tp, pp = int(get("--tp", 1)), int(get("--pp", 1))
    dp = int(get("--dp", world // (tp * pp)))
    mb = int(get("--micro-batch-size", batch // dp))
    return (dp, tp, pp, int(get("--virtual-stages", 1)) if pp > 1 else 1,
            get("--schedule", "1f1b") if pp > 1 else None, int(get("--zero", 0)),
            get("--recompute", "none"), "--sequence-parallel" in a, mb)


def key_of_candidate(c):
    return (c["dp"], c["tp"], c["pp"], c["virtual_stages"],
            c["schedule"] if c["pp"] > 1 else None, c["zero"], c["recompute"],
            c["sequence_parallel"], c["micro_batch"])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("trellis")
    p.add_argument("out")
    p.add_argument("--model", default="baby")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--repeat", type=int, default=1,
                   help="passes over all layouts (each layout: the median of all its steps)")
    p.add_argument("--cluster-rate", help="world 2 across 2 namespaces with links at this rate")
    args = p.parse_args()
    worlds = (2,) if args.cluster_rate else (1, 2)
    cluster = f"pc{os.getpid() % 100000}" if args.cluster_rate else None
    if cluster:
        subprocess.run([SCRIPT, "up", "2", "--name", cluster, "--slots", "1", "--rate",
                        args.cluster_rate], check=True)
    try:
        check_layouts(args, worlds, cluster)
    finally:
        if cluster:
            subprocess.run([SCRIPT, "down", "--name", cluster], check=True)


def check_layouts(args, worlds, cluster):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    os.makedirs(args.out, exist_ok=True)
    load_before = os.getloadavg()

    def launch(world, argv):
        # OpenMPI's default binding (a core per rank): unbound, two one-thread ranks shared a
        # core now and then (bench/RESULTS.md, Planner: calibrated GEMM rates a third lower).
        pre = ["mpirun", "-np", str(world)] if world > 1 else []
        if cluster:
            pre = [SCRIPT, "run", "--name", cluster, "--timeout", "600", "--", "-np", str(world),
                   "--map-by", "node"]
        return subprocess.run(pre + [args.trellis] + argv, check=True, env=env,
                              capture_output=True, text=True).stdout

    threads = ["--threads", "1"] if cluster else []
    plans = {}
    for world in worlds:
        machine = os.path.join(args.out, f"machine_w{world}.json")
        launch(world, ["calibrate", "--out", machine] + threads)
        plan = json.loads(subprocess.run(
            [args.trellis, "plan", "--model", args.model, "--vocab", "256", "--world", str(world),
             "--batch-size", str(args.batch), "--seq-len", str(args.seq_len), "--precision",
             "bf16", "--machine", machine, "--json"] + (["--ranks-per-node", "1"] if cluster
                                                         else []),
            check=True, capture_output=True, text=True).stdout)
        plans[world] = {key_of_candidate(c): c for c in plan["layouts"]}
        plans[world]["first"] = plan["layouts"][0]

    runs = [(w, f) for w, f in LAYOUTS if w in worlds]
    for world in worlds:  # the planner's first choice is measured too
        first = flags_of(plans[world]["first"])
        if all(key_of_flags(w, f, args.batch) != key_of_flags(world, first, args.batch)
               for w, f in runs if w == world):
            runs.append((world, first))

    # --repeat runs every layout once per pass, the passes one after another, so that a drift in
    # the machine's speed over the minutes of a pass reaches every layout alike.
    steps = {i: [] for i in range(len(runs))}
    peaks = {i: [] for i in range(len(runs))}
    for r in range(args.repeat):
        for i, (world, flags) in enumerate(runs):
            d = os.path.join(args.out, "run")
            shutil.rmtree(d, ignore_errors=True)
            launch(world, ["train", "--model", args.model, "--batch-size", str(args.batch),
                           "--seq-len", str(args.seq_len), "--steps", str(args.steps),
                           "--val-every", "0", "--quiet", "--tensorboard", "false",
                           "--precision", "bf16", "--out", d] + threads + flags.split())
            metrics = [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl"))]
            metrics = [m for m in metrics if "step_ms" in m]
            steps[i] += [m["step_ms"] for m in metrics[2:]]  # the first two warm up
            peaks[i].append(max(m["alloc_peak_bytes_max"] for m in metrics))
            print(f"pass {r + 1}: {flags}: {statistics.median(steps[i]):.1f} ms", flush=True)

    rows = []
    for i, (world, flags) in enumerate(runs):
        key = key_of_flags(world, flags, args.batch)
        c = plans[world][key]
        measured = statistics.median(steps[i]) / 1e3
        predicted = c["time"]["step_s"]
        mem = max(peaks[i])
        rows.append({"world": world, "layout": c["layout"], "flags": flags,
                     "measured_s": measured, "predicted_s": predicted,
                     "error": predicted / measured - 1, "measured_bytes": mem,
                     "predicted_bytes": c["memory"]["total"],
                     "memory_error": c["memory"]["total"] / mem - 1,
                     "first": c is plans[world]["first"]})
        print(f"{rows[-1]['layout']:<44} measured {measured * 1e3:7.1f} ms  predicted "
              f"{predicted * 1e3:7.1f} ms  {rows[-1]['error']:+6.1%}  memory "
              f"{rows[-1]['memory_error']:+6.1%}", flush=True)

    errors = sorted(abs(r["error"]) for r in rows)
    summary = {"load_before": load_before, "load_after": os.getloadavg(), "rows": rows,
               "median_abs_error": statistics.median(errors), "worst_abs_error": errors[-1],
               "worst_memory_error": max(abs(r["memory_error"]) for r in rows)}
    for world in worlds:
        mine = [r for r in rows if r["world"] == world]
        first = next(r for r in mine if r["first"])
        fastest = min(mine, key=lambda r: r["measured_s"])
        summary[f"first_choice_w{world}"] = {
            "layout": first["layout"], "measured_s": first["measured_s"],
            "fastest": fastest["layout"], "fastest_s": fastest["measured_s"],
            "slower_than_fastest": first["measured_s"] / fastest["measured_s"] - 1}
    with open(os.path.join(args.out, "plan_check.json"), "w") as f:
        json.dump(summary, f, indent=1)

    print(f"\nload average {load_before[0]:.2f} before, {summary['load_after'][0]:.2f} after")
    print("\n| world | layout | measured ms | predicted ms | error | alloc peak MiB | predicted MiB"
          " | error |\n|---|---|---|---|---|---|---|---|")
    for r in rows:
        mark = " (first choice)" if r["first"] else ""
        print(f"| {r['world']} | `{r['layout']}`{mark} | {r['measured_s'] * 1e3:.1f} | "
              f"{r['predicted_s'] * 1e3:.1f} | {r['error']:+.1%} | "
              f"{r['measured_bytes'] / 2**20:.1f} | {r['predicted_bytes'] / 2**20:.1f} | "
              f"{r['memory_error']:+.1%} |")
    print(f"\nmedian |error| {summary['median_abs_error']:.1%}, worst "
          f"{summary['worst_abs_error']:.1%}; worst memory error "
          f"{summary['worst_memory_error']:.1%}")
    for world in worlds:
        s = summary[f"first_choice_w{world}"]
        print(f"world {world}: first choice {s['layout']} measured {s['measured_s'] * 1e3:.1f} ms,"
              f" fastest {s['fastest']} {s['fastest_s'] * 1e3:.1f} ms "
              f"({s['slower_than_fastest']:+.1%})")


if __name__ == "__main__":
    main()
