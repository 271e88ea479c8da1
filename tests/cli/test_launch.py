"""`trellis launch`: a job that loses a rank is relaunched from its newest checkpoint and ends
exactly where an uninterrupted run ends; restarts are logged; bad input is never retried; the
restarts run out with their own exit code; ranks that stay lost shrink the world (dp first) and
the checkpoint reshards.

Faults are injected with TRELLIS_FAULT (rank R kills itself with SIGKILL before step S, in a given
restart or in every one), so each scenario is deterministic."""
import json
import os

from trellis_test import (check, checkpoint_bytes, checkpoint_tensors, compare_params, fresh_dir,
                          metrics, run, write_text_corpus, TMP)

corpus = fresh_dir("corpus")
write_text_corpus(os.path.join(corpus, "text.txt"))
data = os.path.join(TMP, "data")
run(["prepare", "--input", corpus, "--out", data])
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_mpi_yield_when_idle="1")
ENV.pop("TRELLIS_FAULT", None)


def train_args(out, steps=12, batch=4):
    return ["train", "--model", "tiny", "--data", data, "--batch-size", batch, "--seq-len", 32,
            "--lr", 3e-3, "--warmup-steps", 2, "--val-every", 0, "--save-every", 5,
            "--threads", 1, "--quiet", "--tensorboard=false", "--precision", "fp32",
            "--steps", steps, "--out", out]


def launch(opts, args, fault=None, expect=0):
    env = dict(ENV)
    if fault:
        env["TRELLIS_FAULT"] = fault
    return run(["launch", "--backoff", "0.2", *opts, "--", *args], expect=expect, env=env,
               timeout=600)


def restarts(out):
    path = os.path.join(out, "restarts.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f]


# 1. Rank 1 of 2 dies before step 7 (first attempt only): one restart from step 5, and the run
#    ends bitwise where an uninterrupted 2-rank run ends.
ref = fresh_dir("ref")
launch(["--np", "2"], train_args(ref))
check(restarts(ref) == [], "an uninterrupted job logs no restart")
out = fresh_dir("restarted")
_, err = launch(["--np", "2"], train_args(out), fault="rank=1,step=7,restart=0")
rows = restarts(out)
check(len(rows) == 1, f"one restart logged (got {rows})")
r = rows[0]
check(r["restart"] == 1 and r["resume_step"] == 5 and r["step_reached"] == 6 and
      r["steps_lost"] == 1 and r["world"] == 2 and r["time_lost_s"] >= 0,
      f"restart row: resumed from step 5 after reaching step 6 ({r})")
check("killed" in r["cause"] or r["exit_code"] != 0, f"the cause is recorded ({r['cause']})")
check("trellis launch: the job failed" in err and "restart 1/3" in err,
      f"the restart is announced on stderr:\n{err}")
steps, _ = metrics(out)
check([s["step"] for s in steps] == list(range(1, 13)), "metrics.jsonl holds steps 1..12 once each")
check(all("restart" not in s for s in steps[:5]) and all(s.get("restart") == 1 for s in steps[5:]),
      "rows written after the restart carry restart = 1, earlier ones none")
ref_steps, _ = metrics(ref)
check([s["loss"] for s in steps] == [s["loss"] for s in ref_steps],
      "losses bitwise equal to the uninterrupted run")
for what in ("params", "optimizer"):
    a = checkpoint_bytes(os.path.join(ref, "step_00000012"), what)
    b = checkpoint_bytes(os.path.join(out, "step_00000012"), what)
    check(len(a) > 0 and a == b, f"final {what} bitwise equal")

# 2. A rank that dies before step 3 in every attempt: the restarts run out (exit code 3).
out = fresh_dir("exhausted")
_, err = launch(["--np", "2", "--max-restarts", "2"], train_args(out, steps=6),
                fault="rank=0,step=3,restart=any", expect=3)
check("2 restart(s) are used up" in err, f"trellis launch says it gave up:\n{err}")
check([r["restart"] for r in restarts(out)] == [1, 2], "two restarts logged before giving up")

# 3. Bad input is never retried: the job's own one-line error, exit code 2, no restart log.
out = fresh_dir("bad")
args = train_args(out)
args[args.index("tiny")] = "no-such-model"
_, err = launch(["--np", "2"], args, expect=2)
check("no-such-model" in err, f"train's own message names the bad value:\n{err}")
check(restarts(out) == [] and "restart 1/" not in err, "bad input is not retried")
_, err = run(["launch", "--np", "0", "--", *train_args(out)], expect=2)
check("--np must be >= 1" in err, f"bad --np: {err}")
_, err = run(["launch", "--", "eval", "--checkpoint", "x", "--data", "y"], expect=2)
check("launch runs `train`" in err, f"launch only runs train: {err}")
_, err = run(["launch", "--", *train_args(out)], expect=2,
             env=dict(ENV, TRELLIS_FAULT="rank=1,when=3"))
check("TRELLIS_FAULT" in err, f"a malformed TRELLIS_FAULT is named: {err}")

# 4. Rank 3 of 4 (dp 4) dies before step 6 in every attempt: after two attempts without a new
#    checkpoint the world shrinks to dp 2 (batch 8: dp 3 does not divide it), resumes the dp-4
#    checkpoint of step 5 and finishes equal to one process (layout equivalence, ≤1e-5).
one = fresh_dir("one_process")
run(train_args(one, steps=10, batch=8))
out = fresh_dir("shrunk")
_, err = launch(["--np", "4", "--min-np", "2", "--max-restarts", "4"],
                train_args(out, steps=10, batch=8), fault="rank=3,step=6,restart=any")
rows = restarts(out)
check(len(rows) == 3, f"three failures before the shrink took (got {len(rows)}: {rows})")
check([r["world"] for r in rows] == [4, 4, 2] and rows[-1].get("world_before") == 4,
      f"the world went from 4 to 2 ranks at the third failure ({rows})")
check("world 4 -> 2 (dp 2)" in err, f"the shrink is announced:\n{err}")
got = checkpoint_tensors(os.path.join(out, "step_00000010"))
want = checkpoint_tensors(os.path.join(one, "step_00000010"))
check(len(got) == len(want) > 0, "the shrunk run wrote the same tensors")
worst, worst_name, whole = compare_params(got, want, 32)
check(worst <= 1e-5, f"shrunk run equals one process: worst tensor {worst:.2e} ({worst_name}), "
      f"all {whole:.2e}")
print("test_launch: OK")
