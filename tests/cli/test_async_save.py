"""--async-save writes the same checkpoints as a synchronous save, byte for byte (every file but
state.json, whose config records async_save and out, and that one up to those keys), while training goes
on; metrics.jsonl has a row per save with the stall (checkpoint_stall_ms); the process waits for
the last write before it exits; and a run resumes from an asynchronously written checkpoint."""
import json
import os

from trellis_test import TMP, check, fresh_dir, metrics, mpirun, same_checkpoint, write_text_corpus, run

corpus = fresh_dir("corpus")
write_text_corpus(os.path.join(corpus, "text.txt"))
data = os.path.join(TMP, "data")
run(["prepare", "--input", corpus, "--out", data])
common = ["train", "--model", "tiny", "--data", data, "--batch-size", 4, "--seq-len", 16,
          "--steps", 8, "--save-every", 2, "--val-every", 0, "--threads", 1, "--quiet",
          "--tensorboard", "false", "--dp", 2, "--zero", 1]

sync = fresh_dir("sync")
mpirun(2, common + ["--out", sync])
asy = fresh_dir("async")
mpirun(2, common + ["--out", asy, "--async-save"])

steps = [f"step_{k:08d}" for k in (2, 4, 6, 8)]
for d in (sync, asy):
    check(all(os.path.exists(os.path.join(d, s, "index.json")) for s in steps) and
          not any(n.startswith(".") for n in os.listdir(d)),
          f"{os.path.basename(d)}: checkpoints of steps 2, 4, 6, 8, all committed")
compared = 0
for s in steps:
    files = sorted(os.listdir(os.path.join(sync, s)))
    check(files == sorted(os.listdir(os.path.join(asy, s))), f"{s}: the same files ({files})")
    for f in files:
        with open(os.path.join(sync, s, f), "rb") as a, open(os.path.join(asy, s, f), "rb") as b:
            x, y = a.read(), b.read()
        if f == "state.json":
            x, y = json.loads(x), json.loads(y)
            check(x["config"].pop("async_save") == "false" and y["config"].pop("async_save") == "true",
                  f"{s}: state.json records the mode")
            x["config"].pop("out"), y["config"].pop("out")
        check(x == y, f"{s}/{f}: identical")
        compared += 1
check(compared >= 4 * 5, f"compared {compared} files")

a_rows, _ = metrics(sync)
b_rows, _ = metrics(asy)
check([r["loss"] for r in a_rows] == [r["loss"] for r in b_rows],
      "the same losses with and without --async-save")
with open(os.path.join(asy, "metrics.jsonl")) as f:
    saves = [json.loads(line) for line in f if "checkpoint_stall_ms" in line]
check([r["step"] for r in saves] == [2, 4, 6, 8] and all(r["checkpoint_async"] for r in saves) and
      all(r["checkpoint_stall_ms"] >= 0 for r in saves),
      f"metrics.jsonl: one row per save with its stall ({[r['checkpoint_stall_ms'] for r in saves]})")

# Resuming from an asynchronously written checkpoint.
res = fresh_dir("resumed")
mpirun(2, common + ["--out", res, "--async-save", "--stop-at", 4])
mpirun(2, common + ["--out", res, "--async-save", "--resume"])
check(same_checkpoint(os.path.join(res, steps[-1]), os.path.join(sync, steps[-1])),
      "stopped at 4 and resumed with --async-save: the same final checkpoint")
