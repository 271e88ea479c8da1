"""A rank that dies mid-run ends the whole job quickly, with a message naming a rank; ZeRO-1
shrinks optimizer memory per rank."""
import os
import re
import signal
import subprocess
import time

from trellis_test import (BIN, check, fresh_dir, metrics, mpirun, run, write_text_corpus, TMP)

corpus = fresh_dir("corpus")
write_text_corpus(os.path.join(corpus, "text.txt"), n_lines=800)
data = os.path.join(TMP, "data")
run(["prepare", "--input", corpus, "--out", data])
common = ["train", "--model", "tiny", "--data", data, "--batch-size", 8, "--seq-len", 32,
          "--threads", 1, "--quiet", "--tensorboard", "false", "--val-every", 0]

# ZeRO-1: optimizer state sharded over dp.
sizes = {}
for zero in (0, 1):
    out = fresh_dir(f"mem{zero}")
    mpirun(2, common + ["--steps", 2, "--dp", 2, "--zero", zero, "--out", out])
    sizes[zero] = metrics(out)[0][-1]["mem_bytes"]
check(sizes[1] < 0.8 * sizes[0], f"ZeRO-1 lowers per-rank memory ({sizes[0]} -> {sizes[1]} bytes)")

# Kill one rank mid-run: every rank must exit non-zero within 30 s.
out = fresh_dir("killed")
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
cmd = ["mpirun", "--oversubscribe", "--mca", "mpi_yield_when_idle", "1", "-np", "3", BIN] + \
      [str(a) for a in common + ["--steps", 100000, "--dp", 3, "--batch-size", 9,
                                 "--out", out, "--comm-timeout", 20]]
p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
deadline = time.time() + 120
while time.time() < deadline and not (os.path.exists(os.path.join(out, "metrics.jsonl")) and
                                      os.path.getsize(os.path.join(out, "metrics.jsonl")) > 0):
    time.sleep(0.2)
check(p.poll() is None, "3-rank job is training")
ranks = subprocess.run(["pgrep", "-f", out], capture_output=True, text=True).stdout.split()
victims = [int(r) for r in ranks if r and int(r) != p.pid and
           open(f"/proc/{r}/cmdline").read().startswith(BIN)]
check(len(victims) == 3, f"found the 3 rank processes ({victims})")
os.kill(victims[1], signal.SIGKILL)
t0 = time.time()
try:
    output, _ = p.communicate(timeout=60)
except subprocess.TimeoutExpired:
    p.kill()
    check(False, "job ended after a rank was killed")
elapsed = time.time() - t0
check(p.returncode != 0, f"job exits non-zero (exit {p.returncode})")
check(elapsed < 30, f"job ended {elapsed:.1f} s after the kill")
named = [l for l in output.splitlines() if re.search(r"rank \d+", l)]
check(bool(named), f"the message names the failed rank: {named[:1]}")
left = subprocess.run(["pgrep", "-f", out], capture_output=True, text=True).stdout.split()
check(not left, "no rank process is left running")
