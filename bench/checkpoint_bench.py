"""Checkpoint save cost, synchronous vs --async-save (issue 12), in one run of each mode:
the stall (checkpoint_stall_ms: time training was blocked by a save), the write time
(checkpoint_write_ms: the rank-0 writer's own time) and the bytes each rank wrote.

usage: python3 bench/checkpoint_bench.py TRELLIS_BIN DATA_DIR OUT [ranks] [model] [save_every]
  [steps]
Run it under `flock /tmp/bench.lock` on a quiet machine; it prints the load average it saw."""
import json
import os
import shutil
import statistics
import subprocess
import sys

trellis, data, out = sys.argv[1:4]
ranks = int(sys.argv[4]) if len(sys.argv) > 4 else 2
model = sys.argv[5] if len(sys.argv) > 5 else "gpt2"
save_every = sys.argv[6] if len(sys.argv) > 6 else "2"
steps = sys.argv[7] if len(sys.argv) > 7 else "7"
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
args = ["train", "--model", model, "--data", data, "--seq-len", "64", "--batch-size", str(ranks),
        "--steps", steps, "--save-every", save_every, "--val-every", "0", "--threads", "1", "--quiet",
        "--tensorboard", "false", "--precision", "fp32", "--dp", str(ranks)]
print(f"load average before: {os.getloadavg()}")
for mode in ("sync", "async"):
    d = os.path.join(out, mode)
    shutil.rmtree(d, ignore_errors=True)
    cmd = ["mpirun", "--oversubscribe", "-np", str(ranks), trellis] + args + ["--out", d]
    if mode == "async":
        cmd.append("--async-save")
    subprocess.run(cmd, check=True, env=env)
    rows = [json.loads(line) for line in open(os.path.join(d, "metrics.jsonl"))]
    stalls = [r["checkpoint_stall_ms"] for r in rows if "checkpoint_stall_ms" in r]
    writes = [r["checkpoint_write_ms"] for r in rows if "checkpoint_write_ms" in r]
    step_ms = [r["step_ms"] for r in rows if "step_ms" in r]
    with open(os.path.join(d, f"step_{int(steps):08d}", "index.json")) as f:
        files = json.load(f)["files"]
    per_rank = [v["bytes"] for v in files.values()]
    print(f"{mode}: saves {len(stalls)}, stall ms {[round(s) for s in stalls]} "
          f"(median {statistics.median(stalls):.0f}), rank-0 write ms {[round(w) for w in writes]} "
          f"(median {statistics.median(writes):.0f}), step ms median {statistics.median(step_ms):.0f}, "
          f"bytes per rank {per_rank} (total {sum(per_rank)})")
print(f"load average after: {os.getloadavg()}")
