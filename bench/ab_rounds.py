"""The loop the A/B benchmarks share (zero_ab.py, progress_ab.py, ab_binaries.py): every case
runs once per round, in a fixed order, so that load from other jobs hits all cases alike; the
1-minute load average is read after each run (and logged with it), and its range reported."""
import sys


def load():
    """The 1-minute load average, as /proc/loadavg writes it."""
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


def alternate(rounds, cases, run, describe=None):
    """Runs run(case, round) for round in range(rounds), for each case in order. Returns
    ({case: [its result per round]}, [the load before the first run and after each run]).
    describe(case, round, result), when given, is a line printed to stderr after each run,
    behind `[load L]`."""
    results = {case: [] for case in cases}
    loads = [load()]
    for r in range(rounds):
        for case in cases:
            x = run(case, r)
            results[case].append(x)
            loads.append(load())
            if describe:
                print(f"  [load {loads[-1]}] {describe(case, r, x)}", file=sys.stderr, flush=True)
    return results, loads


def load_range(loads):
    """`low–high` of the loads alternate returned."""
    return f"{min(loads, key=float)}–{max(loads, key=float)}"
