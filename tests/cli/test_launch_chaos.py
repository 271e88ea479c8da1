"""Nothing lost: `trellis launch --np 2` trains 60 steps (a checkpoint every 5) while this test
kill -9s a random rank three times, at random moments, once while a checkpoint is being written.
The final parameters are byte-identical to an uninterrupted run with the same layout, and the
restarts show in restarts.jsonl and metrics.jsonl."""
import json
import os
import random
import signal
import subprocess
import time

from trellis_test import (BIN, check, checkpoint_bytes, fail, fresh_dir, metrics, run, TMP,
                         training_ranks)

seed = int(os.environ.get("CHAOS_SEED", time.time_ns() % 100000))
rng = random.Random(seed)
print(f"test_launch_chaos: seed {seed} (CHAOS_SEED={seed} repeats this run)")
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_mpi_yield_when_idle="1")
ENV.pop("TRELLIS_FAULT", None)
STEPS = 60


def launch_cmd(out):
    # baby at 4 x 32 tokens: steps of tens of ms and checkpoints of ~130 MB (model + AdamW), so
    # the kills land inside steps and saves rather than between runs.
    return [BIN, "launch", "--np", "2", "--max-restarts", "5", "--backoff", "0.2", "--", "train",
            "--model", "baby", "--batch-size", 4, "--seq-len", 32, "--steps", STEPS,
            "--save-every", 5, "--val-every", 0, "--threads", 1, "--quiet", "--tensorboard=false",
            "--precision", "fp32", "--out", out]



def restarts(out):
    path = os.path.join(out, "restarts.jsonl")
    if not os.path.exists(path):
        return 0
    with open(path) as f:
        return sum(1 for _ in f)


def wait_for(cond, what, timeout=120):
    t0 = time.time()
    while not cond():
        if time.time() - t0 > timeout:
            fail(f"timed out waiting for {what}")
        time.sleep(0.005)


ref = fresh_dir("uninterrupted")
subprocess.run([str(a) for a in launch_cmd(ref)], env=ENV, check=True, timeout=600,
               capture_output=True)
out = fresh_dir("chaos")
job = subprocess.Popen([str(a) for a in launch_cmd(out)], env=ENV, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
kills = []
try:
    for k in range(3):
        wait_for(lambda: len(training_ranks(out)) == 2 and restarts(out) == k, f"attempt {k} running")
        if k == 1:  # during a save: its temporary directory exists
            wait_for(lambda: any(n.startswith(".step_") for n in os.listdir(out)),
                     "a checkpoint being written")
            moment = "during a save"
        else:
            delay = rng.uniform(0.5, 2.0)
            time.sleep(delay)
            moment = f"{delay:.2f} s into attempt {k}"
        victims = training_ranks(out)
        if not victims:
            fail(f"attempt {k} ended before its kill ({moment})")
        pid = rng.choice(victims)
        os.kill(pid, signal.SIGKILL)
        kills.append(moment)
        print(f"killed rank pid {pid} {moment}")
        wait_for(lambda: restarts(out) == k + 1, f"restart {k + 1} to be logged")
    output, _ = job.communicate(timeout=600)
finally:
    if job.poll() is None:
        job.kill()
check(job.returncode == 0, f"the supervised job finished (exit {job.returncode}):\n{output[-3000:]}")
check(len(kills) == 3, "three kills landed")
with open(os.path.join(out, "restarts.jsonl")) as f:
    rows = [json.loads(line) for line in f]
check([r["restart"] for r in rows] == [1, 2, 3], f"three restarts logged: {rows}")
steps, _ = metrics(out)
check([s["step"] for s in steps] == list(range(1, STEPS + 1)),
      "metrics.jsonl holds every step once")
check(max(s.get("restart", 0) for s in steps) == 3, "the last rows carry restart = 3")
a = checkpoint_bytes(os.path.join(ref, f"step_{STEPS:08d}"))
b = checkpoint_bytes(os.path.join(out, f"step_{STEPS:08d}"))
check(len(a) > 0 and a == b, "final parameters byte-identical to the uninterrupted run")
ref_steps, _ = metrics(ref)
check([s["loss"] for s in steps] == [s["loss"] for s in ref_steps],
      "every step's loss bitwise equal to the uninterrupted run")
print("test_launch_chaos: OK")
