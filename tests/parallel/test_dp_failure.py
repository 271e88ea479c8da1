"""A rank that dies mid-run ends the whole job: under plain mpirun within seconds (mpirun sees the
death and names the rank); where the launcher does not see it, the surviving ranks give up after
--comm-timeout with trellis's own message naming themselves and the operation. ZeRO-1 shrinks
optimizer memory per rank."""
import os
import re
import signal
import time

from rank_procs import COMM_ERROR, cleanup, output_of, start, wait_training, watch_exits
from trellis_test import check, fresh_dir, metrics, mpirun, run, write_text_corpus, TMP

corpus = fresh_dir("corpus")
write_text_corpus(os.path.join(corpus, "text.txt"), n_lines=800)
data = os.path.join(TMP, "data")
run(["prepare", "--input", corpus, "--out", data])
common = ["train", "--model", "tiny", "--data", data, "--batch-size", 8, "--seq-len", 32,
          "--threads", 1, "--quiet", "--tensorboard", "false", "--val-every", 0]

# ZeRO-1: optimizer state sharded over dp. mem_bytes counts parameters, gradients, AdamW's two
# moments and ZeRO-1's one-shard staging buffer: 4 model sizes replicated, 2 + 3/dp with ZeRO-1
# (2.75 on dp4).
sizes = {}
for zero in (0, 1):
    out = fresh_dir(f"mem{zero}")
    mpirun(4, common + ["--steps", 2, "--dp", 4, "--zero", zero, "--out", out])
    sizes[zero] = metrics(out)[0][-1]["mem_bytes"]
check(sizes[1] < 0.8 * sizes[0], f"ZeRO-1 lowers per-rank memory ({sizes[0]} -> {sizes[1]} bytes)")

# Kill rank 2 of 3 mid-run (SIGKILL): under plain mpirun, mpirun notices the death and ends the
# job, naming the killed rank, before any survivor reaches its timeout (so no trellis message is
# expected here).
np_, victim, timeout = 3, 2, 10
job = common + ["--steps", 100000, "--dp", np_, "--batch-size", 9, "--comm-timeout", timeout]
out = fresh_dir("killed")
p = start(np_, job + ["--out", out])
try:
    ranks = wait_training(p, out, np_)
    check(ranks is not None, f"3-rank job is training (ranks {ranks})")
    os.kill(ranks[victim], signal.SIGKILL)
    t0 = time.time()
    gone, ended = watch_exits(p, list(ranks.values()), t0, 60)
    output = output_of(p, timeout=5)
    check(ended is not None and ended < 10,
          f"mpirun ended the job {ended:.1f} s after the kill (< 10 s)" if ended is not None
          else "mpirun ended the job within 60 s of the kill")
    check(p.returncode != 0, f"job exits non-zero (exit {p.returncode})")
    named = re.search(rf"process rank {victim} with PID \d+ on node \S+ exited on signal 9", output)
    check(named is not None, f"mpirun's message names the killed rank {victim}: "
          f"{named.group(0) if named else output[-1500:]}")
    check(all(t is not None for t in gone.values()), "no rank process is left running")
finally:
    cleanup(p, out)

# The same kill where the launcher does not see the death (a lost node, a launcher that does not
# clean up): each rank runs under `sh -c 'trellis ...; kill -STOP $$'`, so the shell mpirun
# started outlives its rank. Then only trellis ends the job: a surviving rank times out in its
# communication after comm_timeout, prints its own message and aborts the job (exit 1).
wrapper = ["sh", "-c", '"$0" "$@"; kill -STOP $$']
out = fresh_dir("killed_unseen")
p = start(np_, job + ["--out", out], wrapper=wrapper)
try:
    ranks = wait_training(p, out, np_)
    check(ranks is not None, f"3-rank job (ranks under sh) is training (ranks {ranks})")
    os.kill(ranks[victim], signal.SIGKILL)
    t0 = time.time()
    survivors = [pid for r, pid in ranks.items() if r != victim]
    gone, ended = watch_exits(p, survivors, t0, timeout + 20)
    output = output_of(p, timeout=5)
    limit = timeout + 5
    check(ended is not None and ended <= limit,
          f"the job ended {ended:.1f} s after the kill (comm_timeout {timeout} s + 5 s = {limit} s)"
          if ended is not None else f"the job ended within {timeout + 20} s of the kill")
    check(all(t is not None and t <= limit for t in gone.values()),
          f"every surviving rank exited within {limit} s of the kill "
          f"({', '.join('-' if t is None else f'{t:.1f} s' for t in gone.values())})")
    check(p.returncode == 1, f"job exits 1, the code trellis aborts with (exit {p.returncode})")
    msgs = list(COMM_ERROR.finditer(output))
    check(bool(msgs), "a rank printed trellis's communication error: "
          + (msgs[0].group(0) if msgs else f"none in\n{output[-2000:]}"))
    check(all(int(m["rank"]) != victim for m in msgs),
          f"the messages come from surviving ranks, not the killed rank {victim}")
    check(all(m["timeout"] is None or float(m["timeout"]) == timeout for m in msgs),
          f"a timeout message names comm_timeout = {timeout} s")
    check(not re.search(rf"process rank {victim} .*exited on signal", output),
          "mpirun did not see the death (the wrapper hid it): trellis ended the job")
finally:
    cleanup(p, out)
