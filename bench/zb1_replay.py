#!/usr/bin/env python3
"""Bubble of a pp-stage schedule computed from per-op timings: the median compute time of each pass
(forward; whole backward; or zb1's input and weight parts) over all ranks and ops of the traced
steps after the first (the trace's compute_us: the op's span less its wait for messages), then
every rank's op list replayed with those times and instant messages. bubble = 1 - busy / (pp x
span), as the pipeline defines it. Usage: zb1_replay.py TRACE.json [...] (4 stages, 5 traced steps)."""
import json
import statistics
import sys


def op_times(path, pp, steps):
    events = [e for e in json.load(open(path))["traceEvents"] if e["ph"] == "X"]
    per_rank = {r: sorted((e for e in events if e["tid"] == r), key=lambda e: e["ts"])
                for r in range(pp)}
    k = len(per_rank[0]) // steps
    body = [e for r in range(pp) for e in per_rank[r][k:]]
    times = {c: statistics.median(e["args"]["compute_us"] for e in body if e["cat"] == c)
             for c in {e["cat"] for e in body}}
    lists = {r: [(e["cat"], e["args"]["micro_batch"]) for e in per_rank[r][:k]] for r in range(pp)}
    return times, lists


def replay(lists, times, pp):
    done, clock, nxt = {}, [0.0] * pp, [0] * pp
    left, busy = sum(len(o) for o in lists.values()), 0.0
    while left:
        moved = False
        for r in range(pp):
            while nxt[r] < len(lists[r]):
                cat, i = lists[r][nxt[r]]
                if cat == "forward":
                    dep = ("f", r - 1, i) if r > 0 else None
                elif cat == "weight_grad":
                    dep = None  # after its input part, earlier in this rank's list
                else:
                    dep = ("b", r + 1, i) if r < pp - 1 else None
                if dep and dep not in done:
                    break
                start = max(clock[r], done[dep] if dep else 0.0)
                clock[r] = start + times[cat]
                busy += times[cat]
                kind = "f" if cat == "forward" else "w" if cat == "weight_grad" else "b"
                done[(kind, r, i)] = clock[r]
                nxt[r] += 1
                left -= 1
                moved = True
        assert moved, "the op lists deadlock"
    span = max(clock)
    return 1 - busy / (pp * span)


for path in sys.argv[1:]:
    times, lists = op_times(path, pp=4, steps=5)
    print(f"{path}: bubble {replay(lists, times, 4):.3f} from median op ms "
          + ", ".join(f"{c} {t / 1e3:.2f}" for c, t in sorted(times.items())))
