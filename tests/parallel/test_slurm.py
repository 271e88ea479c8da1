"""trellis under a real Slurm (Debian's slurmctld, slurmd and munge; tests/slurm.py,
scripts/slurm_cluster.sh): one 2-node cluster of network namespaces, started once for all the
checks, each node running its own slurmd; jobs are submitted from node 1, the login node.

- srun directly: a dp2 job with one rank on each node (srun --mpi=pmix, how Debian's OpenMPI 4
  bootstraps under Slurm) equals the 1-process run to <= 1e-5 (40 steps' losses, validation
  losses, step 20's parameters), and its gradients crossed the nodes' links.
- srun without --mpi (Slurm's default MpiDefault=none): every task exits 2 with one line naming
  --mpi=pmix, instead of each training alone into the same directory.
- sbatch: a batch script (2 nodes, 1 task per node, 1 CPU per task, --requeue) running `trellis
  launch --launcher srun ... --resume`, requeued mid-run (scontrol requeue), runs again from its
  newest checkpoint and equals the 1-process run too, and bitwise the srun run.
- kill -9 of one rank of a `trellis launch --launcher srun` job (in salloc), after its first
  checkpoint: the job restarts from a checkpoint at once (srun --kill-on-bad-exit) and ends
  bitwise equal (losses and final parameters) to the uninterrupted srun run.

The cluster is gone afterwards (daemons, namespaces, state), also when a check fails."""
import json
import os
import signal
import subprocess
import time

from slurm import SlurmCluster
from trellis_test import (BIN, LayoutCheck, TMP, check, checkpoint_bytes, fail, fresh_dir,
                          metrics, run, training_ranks, write_text_corpus)

B, T, C, L, STEPS = 8, 32, 32, 4, 40
corpus = fresh_dir("corpus")
write_text_corpus(os.path.join(corpus, "text.txt"), n_lines=800)
data = os.path.join(TMP, "data")
run(["prepare", "--input", corpus, "--out", data])
common = ["train", "--model", "tiny", "--n-layer", L, "--n-head", 4, "--n-embd", C,
          "--data", data, "--steps", STEPS, "--batch-size", B, "--micro-batch-size", 2,
          "--seq-len", T, "--lr", 3e-3, "--warmup-steps", 4, "--val-every", 20,
          "--save-every", 5, "--threads", 1, "--quiet", "--tensorboard", "false",
          "--precision", "fp32", "--comm-timeout", 60]  # below the jobs' bounds: trellis says where
# srun passes the submitting shell's environment on to the ranks (two ranks share 2 cores).
ENV = dict(os.environ, OMPI_MCA_mpi_yield_when_idle="1")
ENV.pop("TRELLIS_FAULT", None)
t0 = time.time()
# Parameters compared at step 20, as every other layout test's 20-step run: by step 40 Adam has
# grown the summation-order difference of dp2 to 1.1e-5 in one tensor on an AVX2 CPU (Zen 3),
# where the 40 losses still agree to 2e-7.
layouts = LayoutCheck(common, n_embd=C, steps=STEPS, name="baseline", param_step=20)
P = sum(v.size for v in layouts.base[2].values())  # parameters
MB = 1e6


def phase(name):
    print(f"[{time.time() - t0:5.1f} s] {name}")


def last_step(out):
    try:
        return max((s["step"] for s in metrics(out)[0]), default=0)
    except (OSError, ValueError):  # not written yet, or a line being written
        return 0



def wait_for(cond, what, timeout, ended=None, every=0.002):
    """Polls cond every `every` s until it holds; fails after `timeout` s, or as soon as
    ended() (checked every 0.2 s) returns why the job it waits on is over."""
    t = last_check = time.time()
    while not cond():
        if time.time() - t > timeout:
            fail(f"timed out waiting for {what}")
        if ended is not None and time.time() - last_check >= 0.2:
            last_check = time.time()
            why = ended()
            if why:
                fail(f"{why} before {what}")
        time.sleep(every)


FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


phase("cluster up")
cluster = SlurmCluster(nodes=2)
with cluster as c:
    print(c.started)
    out, _ = c.login(["sinfo", "-h", "-N", "-o", "%N %T %c"])
    nodes = sorted(line.split() for line in out.splitlines())
    check(nodes == [[ns, "idle", "2"] for _, ns, _ in c.hosts],
          f"sinfo shows both nodes idle with 2 CPUs: {nodes}")

    # 1. srun directly, one rank per node.
    phase("srun dp2")
    def srun(n, args):
        return c.login(["srun", "--nodes", n, "--ntasks-per-node", 1, "--mpi=pmix", BIN] + args,
                       timeout=120, env=ENV)
    before = c.traffic()
    layouts.check("srun_dp2", 2, ["--dp", 2], launch=srun)
    moved = c.traffic_since(before)
    need = STEPS * 4 * P  # the whole fp32 gradient every step, each way (ring all-reduce of 2)
    check(all(min(v) >= need for v in moved.values()),
          f"srun_dp2: each node's link carried >= {need / MB:.2f} MB each way (" +
          ", ".join(f"{ns} in {i / MB:.2f} / out {o / MB:.2f} MB" for ns, (i, o) in moved.items())
          + ")")
    ref = os.path.join(TMP, "srun_dp2")

    # 2. srun without an MPI plugin: refused, not two lone runs.
    phase("srun without --mpi")
    lone = fresh_dir("srun_no_mpi")
    _, err = c.login(["srun", "--nodes", 2, "--ntasks-per-node", 1, BIN] + common +
                     ["--dp", 2, "--out", lone], timeout=60, env=ENV, expect=2)
    check("without an MPI bootstrap" in err and "--mpi=pmix" in err and
          not os.path.exists(os.path.join(lone, "metrics.jsonl")),
          "srun without --mpi: exit 2 naming --mpi=pmix, nothing trained: " +
          next((line for line in err.splitlines() if "trellis: error" in line), err[-300:]))

    # 3. sbatch: the batch script docs/multinode.md shows, shrunk to this cluster, requeued once
    #    after its first checkpoint (scontrol requeue, as a preempted or failed node does).
    phase("sbatch, requeued")
    def job_state(job):
        out, _ = c.login(["scontrol", "-o", "show", "job", job], timeout=30)
        return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)

    def state_if_over(job):
        state = job_state(job)
        return f"job {job} ended ({state['JobState']}, exit {state['ExitCode']})" \
            if state["JobState"] in FINAL else None

    def sbatch(n, args):
        out = args[args.index("--out") + 1]
        args = [str(a) for a in args if a != "--quiet"]  # its header names the resumed checkpoint
        script = os.path.join(out, "job.sh")
        log = os.path.join(out, "slurm.out")
        with open(script, "w") as f:
            f.write("#!/bin/bash\n"
                    f"#SBATCH --nodes={n}\n#SBATCH --ntasks-per-node=1\n#SBATCH --cpus-per-task=1\n"
                    f"#SBATCH --requeue\n#SBATCH --open-mode=append\n#SBATCH --output={log}\n"
                    f"exec {BIN} launch --launcher srun --np \"$SLURM_NTASKS\" --max-restarts 2 "
                    "--backoff 0.2 "
                    f"-- {' '.join(args)} --log-every 10 --resume\n")
        job = c.login(["sbatch", "--parsable", script], timeout=30, env=ENV)[0].strip()
        try:
            wait_for(lambda: last_step(out) >= 6, f"job {job} at step 6", 60,
                     ended=lambda: state_if_over(job))
            # Hold the ranks where they are, so that the requeue (a second or so through
            # scontrol) lands mid-run however fast the steps go: Slurm sends SIGCONT with the
            # SIGTERM that ends them.
            for pid in training_ranks(out):
                os.kill(pid, signal.SIGSTOP)
            at = last_step(out)
            saved = max(d for d in os.listdir(out) if d.startswith("step_"))[5:]  # complete ones
            phase(f"job {job} held at step {at}, checkpoint {saved}")
            c.login(["scontrol", "requeue", job], timeout=30)
            # Slurm holds a requeued job back (BeginTime) before it may start again.
            wait_for(lambda: job_state(job)["JobState"] == "PENDING", f"job {job} requeued", 60,
                     every=0.1)
            phase(f"job {job} pending")
            c.login(["scontrol", "update", f"JobId={job}", "StartTime=now"], timeout=30)
            wait_for(lambda: job_state(job)["JobState"] in FINAL, f"job {job} to end", 120,
                     every=0.1)
        finally:
            if os.path.exists(log):
                with open(log) as f:
                    text = f.read()
                print(f"{log}:\n{text[-3000:]}")
        state = job_state(job)
        check(state["JobState"] == "COMPLETED" and state["ExitCode"] == "0:0" and
              state["Restarts"] == "1" and at < STEPS,
              f"sbatch job {job} requeued at step {at} of {STEPS} completed: JobState "
              f"{state['JobState']}, ExitCode {state['ExitCode']}, Restarts {state['Restarts']}" +
              ("" if state["JobState"] == "COMPLETED" else f"\n{c.logs()}"))
        resumed = [line.rsplit("/step_", 1)[-1] for line in text.splitlines()
                   if "resumed from" in line]
        # Slurm's SIGCONT comes before its SIGTERM, so the ranks may finish a save in between.
        check(len(resumed) == 1 and resumed[0].isdigit() and saved <= resumed[0] and
              int(resumed[0]) < STEPS,
              f"the requeued job resumed mid-run from a checkpoint no older than the newest one "
              f"when it was held ({saved}): {resumed}")
        return text, ""
    layouts.check("sbatch_dp2", 2, ["--dp", 2], launch=sbatch)
    a = checkpoint_bytes(os.path.join(ref, f"step_{STEPS:08d}"))
    b = checkpoint_bytes(os.path.join(TMP, "sbatch_dp2", f"step_{STEPS:08d}"))
    check(len(a) > 0 and a == b, "sbatch_dp2: final parameters bitwise equal to srun_dp2's")

    # 4. kill -9 of one rank of a `trellis launch --launcher srun` job.
    phase("kill -9 under trellis launch")
    chaos = fresh_dir("srun_chaos")
    cmd = [BIN, "launch", "--launcher", "srun", "--np", 2,
           "--max-restarts", 2, "--backoff", 0.2, "--"] + common + ["--dp", 2, "--out", chaos]
    # Inside an allocation, as in a batch script: each attempt is a step of it.
    salloc = ["salloc", "--nodes", 2, "--ntasks-per-node", 1]
    job = subprocess.Popen(c.login_cmd(180) + [str(a) for a in salloc + cmd], env=ENV,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    def job_over():
        return None if job.poll() is None else \
            f"the job ended (exit {job.returncode}):\n{job.communicate()[0][-3000:]}\n"

    try:
        wait_for(lambda: len(training_ranks(chaos)) == 2, "both ranks to start", 60, job_over, every=0.01)
        victims = training_ranks(chaos)
        wait_for(lambda: last_step(chaos) >= 6, "step 6 (after the first checkpoint)", 60,
                 job_over)
        victim = victims[int(time.time_ns()) % 2]
        os.kill(victim, signal.SIGKILL)
        at = last_step(chaos)
        print(f"killed rank pid {victim} after step {at}")
        output, _ = job.communicate(timeout=180)
    finally:
        if job.poll() is None:
            job.kill()
    check(job.returncode == 0 and at < STEPS,
          f"the job killed at step {at} of {STEPS} finished (exit {job.returncode}):\n"
          f"{output[-3000:]}")
    with open(os.path.join(chaos, "restarts.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    check(len(rows) == 1 and rows[0]["exit_code"] != 0 and rows[0]["resume_step"] >= 5 and
          rows[0]["world"] == 2, f"one restart, from a checkpoint: {rows}")
    # srun --kill-on-bad-exit (trellis launch passes it) ends the surviving rank at once; without
    # it that rank waited out its --comm-timeout (60 s here) before the job could restart.
    check("timed out after" not in output,
          "the surviving rank was ended by srun, not by its own --comm-timeout")
    steps, _ = metrics(chaos)
    check([s["step"] for s in steps] == list(range(1, STEPS + 1)),
          "metrics.jsonl holds every step once")
    check([s["loss"] for s in steps] == [s["loss"] for s in metrics(ref)[0]],
          "every step's loss bitwise equal to the uninterrupted srun run")
    a = checkpoint_bytes(os.path.join(ref, f"step_{STEPS:08d}"))
    b = checkpoint_bytes(os.path.join(chaos, f"step_{STEPS:08d}"))
    check(len(a) > 0 and a == b, "final parameters bitwise equal to the uninterrupted srun run")

phase("cluster down")
check(not cluster.leftovers(), f"no namespace, veth, bridge or state left of {cluster.name}")
state = f"/run/trellis-netns/{cluster.name}/"
left = subprocess.run(["pgrep", "-f", state], capture_output=True, text=True).stdout.split()
check(not left, f"no munged, slurmctld, slurmd or job process left of {cluster.name} ({left})")
print(f"slurm checks took {time.time() - t0:.0f} s (P = {P} parameters)")
