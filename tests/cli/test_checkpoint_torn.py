"""Torn and interrupted sharded checkpoints: --resume passes over a newest checkpoint whose
index.json is missing or whose shard is shorter than the index says, with one warning line naming
the file, and resumes from the previous one; reading a torn checkpoint directly (eval) is an
error naming the file. A run killed (SIGKILL) while it writes a checkpoint leaves only a
temporary directory without an index; the previous checkpoint still loads and the resumed run
equals an uninterrupted one. A failed write is an error on every rank, not silence."""
import os
import shutil
import signal
import subprocess
import time

from trellis_test import (BIN, TMP, check, checkpoint_tensors, fresh_dir, metrics, mpirun, run,
                          same_checkpoint, with_precision, write_text_corpus)

corpus = fresh_dir("corpus")
write_text_corpus(os.path.join(corpus, "text.txt"))
data = os.path.join(TMP, "data")
run(["prepare", "--input", corpus, "--out", data])
shard = os.path.join(data, "val_000000.bin")
common = ["train", "--model", "tiny", "--data", data, "--batch-size", 4, "--seq-len", 16,
          "--steps", 6, "--val-every", 0, "--threads", 1, "--quiet", "--tensorboard", "false"]

full = fresh_dir("full")
run(common + ["--out", full])
base = fresh_dir("base")
run(common + ["--out", base, "--save-every", 2, "--stop-at", 4])


def step(out, k):
    return os.path.join(out, f"step_{k:08d}")


def resume_after(name, tear):
    """Copies base, tears its step 4 with `tear`, resumes: returns (stderr, resumed dir)."""
    out = os.path.join(TMP, name)
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(base, out)
    named = tear(step(out, 4))
    _, err = run(common + ["--out", out, "--resume"])
    warnings = [l for l in err.splitlines() if "incomplete checkpoint" in l]
    check(len(warnings) == 1 and named in warnings[0],
          f"{name}: one warning line naming {os.path.basename(named)}: {warnings}")
    rows, _ = metrics(out)
    check([r["step"] for r in rows] == [1, 2, 3, 4, 5, 6], f"{name}: resumed from step 2")
    check(same_checkpoint(step(out, 6), step(full, 6)),
          f"{name}: the resumed run ends where the uninterrupted one does")
    return err


def drop_index(d):
    os.remove(os.path.join(d, "index.json"))
    return os.path.join(d, "index.json")


def truncate_shard(d):
    path = os.path.join(d, "shard_00000.safetensors")
    with open(path, "rb") as f:
        blob = f.read()
    with open(path, "wb") as f:
        f.write(blob[:len(blob) - 100])
    return path


resume_after("no_index", drop_index)
resume_after("truncated", truncate_shard)

# Reading it directly: an error naming the file.
torn = fresh_dir("torn")
shutil.copytree(step(base, 4), step(torn, 4))
path = truncate_shard(step(torn, 4))
_, err = run(["eval", "--checkpoint", step(torn, 4), "--data", shard, "--seq-len", 16,
              "--batch-size", 2, "--batches", 1], expect=2)
check(path in err and "the index says" in err, f"eval of a torn checkpoint names the file: {err}")

# SIGKILL in the middle of a save (the test hook sleeps inside every rank's write of step 6).
killed = os.path.join(TMP, "killed")
shutil.rmtree(killed, ignore_errors=True)
shutil.copytree(base, killed)
env = dict(os.environ, TRELLIS_TEST_SAVE_SLEEP="60")
p = subprocess.Popen([BIN] + with_precision(common + ["--out", killed, "--resume"]), env=env,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
tmp = os.path.join(killed, ".step_00000006.tmp")
deadline = time.time() + 120
while time.time() < deadline and not os.path.exists(os.path.join(tmp, "shard_00000.safetensors")):
    time.sleep(0.1)
check(os.path.exists(os.path.join(tmp, "shard_00000.safetensors")), "the save of step 6 started")
p.send_signal(signal.SIGKILL)
p.wait()
check(not os.path.exists(step(killed, 6)) and not os.path.exists(os.path.join(tmp, "index.json")),
      "killed mid-save: no step_00000006, no index in the temporary directory")
_, err = run(common + ["--out", killed, "--resume"])
check("incomplete" not in err, "the temporary directory is not a checkpoint candidate")
check(same_checkpoint(step(killed, 6), step(full, 6)),
      "resumed from step 4 after the kill, the run ends where the uninterrupted one does")
check(not os.path.exists(tmp), "the killed save's temporary directory is gone (removed at start-up)")

# A failed write (TRELLIS_TEST_SAVE_FAIL=1: rank 1's) fails the run on every rank, naming it;
# the async writer's failure too. The previous checkpoint stays the newest.
for mode in ([], ["--async-save"]):
    out = fresh_dir("fail" + "".join(mode))
    os.environ["TRELLIS_TEST_SAVE_FAIL"] = "1"
    try:
        _, err = mpirun(2, common + mode + ["--dp", 2, "--out", out], expect=None)
    finally:
        del os.environ["TRELLIS_TEST_SAVE_FAIL"]
    # Whichever rank ends the job first speaks: the one that failed, or one that learned of it.
    check("checkpoint of step 6" in err and
          ("simulated failure" in err or "another rank's write failed" in err),
          f"{mode or 'sync'}: a failed write ends the job with an error naming the step: "
          f"{err.strip().splitlines()[-3:]}")
    check(not os.path.exists(step(out, 6)), f"{mode or 'sync'}: no checkpoint of step 6")
