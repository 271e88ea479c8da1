"""A stop signal ends `train` at the next step boundary with that step saved, and --resume then
continues bit for bit: SIGTERM to one process (exit 143) and SIGINT (exit 130); under mpirun,
SIGTERM to rank 1 only, which every rank must learn of at the same step (both save it, and the
lead names it), SIGTERM to mpirun, which passes it on to the ranks (a scheduler's way), and
SIGTERM to `trellis launch`, which passes it on to its job and exits 130 without a restart. Each stopped run is compared with a run that was never stopped: its losses and the
checkpoint after 4 more steps bitwise equal."""
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time

from trellis_test import (BIN, TMP, check, fail, fresh_dir, metrics, run, mpirun, same_checkpoint,
                          training_ranks, with_precision, write_text_corpus)

corpus = fresh_dir("corpus")
write_text_corpus(os.path.join(corpus, "text.txt"))
data = os.path.join(TMP, "data")
run(["prepare", "--input", corpus, "--out", data])
# Many steps: the signal ends the run long before; the schedule is the same in every run.
common = ["--model", "tiny", "--data", data, "--batch-size", 4, "--seq-len", 32, "--lr", 3e-3,
          "--warmup-steps", 3, "--steps", 100000, "--val-every", 0, "--threads", 1, "--quiet",
          "--tensorboard", "false"]
MORE = 4  # steps trained after the resume
MPI_ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")


def logged_steps(out):
    try:
        return len(metrics(out)[0])
    except (OSError, ValueError):  # not yet written, or a line being written
        return 0


def stop_mid_run(what, sig, np_=1, extra=(), to_rank=None, launch=False):
    """Starts the run (under `trellis launch` with launch), signals it after 3 logged steps (the
    process, mpirun or launch, or the rank to_rank under mpirun); returns (exit code, stderr, out
    dir)."""
    out = fresh_dir(what)
    args = with_precision(["train", "--out", out] + common + list(extra))
    session = tempfile.mkdtemp(prefix="ompi-") if np_ > 1 else None
    cmd = [BIN] + args
    env = None
    if np_ > 1:
        cmd = ["mpirun", "--oversubscribe", "-np", str(np_)] + cmd
        env = dict(MPI_ENV, OMPI_MCA_orte_tmpdir_base=session)
    if launch:
        cmd = [BIN, "launch", "--np", str(np_), "--"] + args
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.time() + 120
        while logged_steps(out) < 3:
            if p.poll() is not None or time.time() > deadline:
                fail(f"{what}: the run ended or stalled before 3 steps: {p.communicate()}")
            time.sleep(0.1)
        target = p.pid
        if to_rank is not None:
            ranks = {}
            for pid in training_ranks(out):
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env_vars = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
                ranks[int(env_vars.get(b"OMPI_COMM_WORLD_RANK", b"-1"))] = pid
            check(sorted(ranks) == list(range(np_)), f"{what}: found the ranks {sorted(ranks)}")
            target = ranks[to_rank]
        os.kill(target, sig)
        _, err = p.communicate(timeout=120)
    except BaseException:
        p.kill()
        raise
    finally:
        if session:
            shutil.rmtree(session, ignore_errors=True)
    return p.returncode, err, out


def check_stopped(what, rc, err, out, want_rc, name, np_=1, extra=()):
    m = re.search(rf"trellis: {name} stopped the run after step (\d+): checkpoint (\S+) \(train "
                  r"again with --resume", err)
    check(m is not None, f"{what}: the lead says where it stopped ({err[-600:]!r})")
    n = int(m.group(1))
    if want_rc is not None:
        check(rc == want_rc, f"{what}: exit code {rc}, expected {want_rc}")
    else:
        check(rc != 0, f"{what}: mpirun reports the stop ({rc})")
    ckpt = os.path.join(out, f"step_{n:08d}")
    check(m.group(2) == ckpt and os.path.exists(os.path.join(ckpt, "index.json")),
          f"{what}: step {n}'s checkpoint is committed at {m.group(2)}")
    check(logged_steps(out) == n, f"{what}: no step after {n} was trained")
    # Resumed for MORE steps against a run never stopped.
    launch = run if np_ == 1 else (lambda a: mpirun(np_, a))
    args = ["train"] + common + list(extra) + ["--stop-at", n + MORE]
    launch(args + ["--out", out, "--resume"])
    whole = fresh_dir(what + "_whole")
    launch(args + ["--out", whole])
    a, b = metrics(whole)[0], metrics(out)[0]
    check([r["step"] for r in b] == list(range(1, n + MORE + 1)),
          f"{what}: the resumed run logs steps 1..{n + MORE} once")
    check([r["loss"] for r in a] == [r["loss"] for r in b], f"{what}: losses bitwise equal")
    last = f"step_{n + MORE:08d}"
    check(same_checkpoint(os.path.join(whole, last), os.path.join(out, last)),
          f"{what}: parameters and optimizer state bitwise equal after {MORE} more steps")


for what, sig, want, name in (("term", signal.SIGTERM, 143, "SIGTERM"),
                              ("int", signal.SIGINT, 130, "SIGINT")):
    rc, err, out = stop_mid_run(what, sig)
    check_stopped(what, rc, err, out, want, name)

dp = ["--dp", 2, "--zero", 1]
for what, to_rank in (("dp2_rank1", 1), ("dp2_mpirun", None)):
    rc, err, out = stop_mid_run(what, signal.SIGTERM, np_=2, extra=dp, to_rank=to_rank)
    check_stopped(what, rc, err, out, None, "SIGTERM", np_=2, extra=dp)
rc, err, out = stop_mid_run("launch", signal.SIGTERM, np_=2, extra=dp, launch=True)
check("restart" not in err, "launch: no restart of a job a signal stopped")
check_stopped("launch", rc, err, out, 130, "SIGTERM", np_=2, extra=dp)
print("PASS test_stop_signal")
