"""Ensembles of classifiers (`ensemble` key; cli/ensemble.h):

- `train --ensemble 3` trains members into OUT/member_K, member K bitwise the run of the same
  config with seed + K - 1, and writes OUT/ensemble.json naming the members and their seeds;
- `classify` with several checkpoints (or OUT) prints, per line, the mean of the members' class
  probabilities (as each member's own `classify` prints them) and its most probable class;
- `eval --checkpoint OUT` on the validation split reports the accuracy and loss those mean
  probabilities give, re-derived here from `classify` on the same texts, and ensemble.json the same;
- with time_budget, a member that would not fit the minutes left is not started;
- killed inside member 1 and resumed, the members are bitwise those of a run never stopped;
- under dp2 every rank takes the same decisions and the ensemble equals dp1's;
- bad input exits 2 with one line: ensemble < 1, a language model's data, stop_at, several
  checkpoints on a token shard, a broken ensemble.json, members with different classes."""
import json
import math
import os

from trellis_test import (check, expect_error, fresh_dir, mpirun, rel_err, run, same_checkpoint,
                          write_classify_tsv, write_text_corpus)

tmp = fresh_dir("ensemble")
train_tsv, val_tsv = os.path.join(tmp, "train.tsv"), os.path.join(tmp, "val.tsv")
write_classify_tsv(train_tsv, n=90, seed=7)
write_classify_tsv(val_tsv, n=30, seed=11)
data = os.path.join(tmp, "classify")
run(["prepare", "--task", "classify", "--input", train_tsv, "--val-input", val_tsv, "--out", data])
with open(val_tsv) as f:
    rows = [line.rstrip("\n").split("\t") for line in f.readlines()[1:]]
val_texts, val_labels = [r[0] for r in rows], [r[1] for r in rows]
texts = os.path.join(tmp, "val_texts.txt")
with open(texts, "w") as f:
    f.write("\n".join(val_texts) + "\n")

common = ["train", "--model", "encoder-tiny", "--data", data, "--batch-size", 8, "--lr", 3e-3,
          "--warmup-steps", 2, "--steps", 12, "--val-every", 6, "--threads", 1, "--quiet",
          "--tensorboard", "false", "--precision", "fp32", "--seed", 5]

# Three members, each the run of its seed.
out = fresh_dir("ensemble_run")
run(common + ["--ensemble", 3, "--out", out])
with open(os.path.join(out, "ensemble.json")) as f:
    manifest = json.load(f)
check(manifest["members"] == [f"member_{k}/step_00000012" for k in (1, 2, 3)] and
      manifest["seeds"] == [5, 6, 7], f"ensemble.json names 3 members and seeds: {manifest}")
solo = fresh_dir("ensemble_solo")
run(common[:-1] + [6, "--out", solo])
check(same_checkpoint(os.path.join(out, "member_2", "step_00000012"),
                      os.path.join(solo, "step_00000012")),
      "member 2 is bitwise the run with seed + 1")
check(not same_checkpoint(os.path.join(out, "member_1", "step_00000012"),
                          os.path.join(out, "member_2", "step_00000012")),
      "members 1 and 2 differ")


def classify(*checkpoints):
    got, _ = run(["classify", "--checkpoint", *checkpoints, "--input", texts, "--threads", 1])
    return [json.loads(line) for line in got.splitlines()]


members = [os.path.join(out, m) for m in manifest["members"]]
alone = [classify(m) for m in members]
together = classify(*members)
check(classify(out) == together, "classify --checkpoint OUT equals the members listed")
check(len(together) == len(val_texts) == 30, f"one line per text: {len(together)}")
worst, compared = 0.0, 0
for i, row in enumerate(together):
    for c, p in row["probabilities"].items():
        mean = sum(a[i]["probabilities"][c] for a in alone) / 3
        worst = max(worst, abs(p - mean))
        compared += 1
    best = max(row["probabilities"], key=lambda c: row["probabilities"][c])
    check(row["label"] == best, f"line {i}: the label is the most probable class")
check(compared == 90 and worst <= 1e-12,
      f"ensemble probabilities are the members' mean ({compared} compared, worst {worst:.1e})")
check(any(together[i]["label"] != alone[0][i]["label"] for i in range(30)) or
      any(abs(together[i]["probabilities"][c] - alone[0][i]["probabilities"][c]) > 1e-3
          for i in range(30) for c in together[i]["probabilities"]),
      "the ensemble is not member 1 alone")

# eval: accuracy and loss of the mean probabilities on the validation split.
acc = sum(r["label"] == y for r, y in zip(together, val_labels)) / 30
loss = -sum(math.log(r["probabilities"][y]) for r, y in zip(together, val_labels)) / 30
ev, _ = run(["eval", "--checkpoint", out, "--data", data, "--batch-size", 8, "--threads", 1])
got = json.loads(ev)
check(got["members"] == 3 and got["examples"] == 30 and got["accuracy"] == acc and
      rel_err(got["loss"], loss) < 1e-6,
      f"eval --checkpoint OUT: accuracy {got['accuracy']} loss {got['loss']} (classify: {acc}, "
      f"{loss})")
check(manifest["val_accuracy"] == acc and rel_err(manifest["val_loss"], loss) < 1e-6 and
      manifest["val_examples"] == 30,
      f"ensemble.json: val_accuracy {manifest['val_accuracy']} val_loss {manifest['val_loss']}")
one, _ = run(["eval", "--checkpoint", members[0], "--data", data, "--threads", 1])
acc1 = sum(r["label"] == y for r, y in zip(alone[0], val_labels)) / 30
check("members" not in json.loads(one) and json.loads(one)["accuracy"] == acc1,
      "eval of one member: that member's accuracy")

# time_budget: after member 1 no time is left (0.001 min), so no member 2 starts.
short = fresh_dir("ensemble_budget")
got, _ = run(common + ["--ensemble", 3, "--time-budget", 0.001, "--out", short,
                       "--quiet", "false"])
with open(os.path.join(short, "ensemble.json")) as f:
    m = json.load(f)
check(len(m["members"]) == 1 and not os.path.exists(os.path.join(short, "member_2")),
      f"a budget spent by member 1 trains 1 member: {m['members']}")
check("ensemble: 1 of 3 members fit time_budget" in got, "the cut is named in one line")
roomy = fresh_dir("ensemble_roomy")
run(common + ["--ensemble", 2, "--time-budget", 30, "--out", roomy])
with open(os.path.join(roomy, "ensemble.json")) as f:
    check(len(json.load(f)["members"]) == 2, "a budget with room trains every member")

# Killed in member 1 and resumed: each member resumes from its own checkpoints, and the ensemble
# is bitwise the one never stopped.
killed = fresh_dir("ensemble_killed")
run(common + ["--ensemble", 2, "--save-every", 4, "--out", killed], expect=-9,
    env={**os.environ, "TRELLIS_FAULT": "rank=0,step=7"})
check(not os.path.exists(os.path.join(killed, "member_2")), "the kill stopped member 1")
run(common + ["--ensemble", 2, "--save-every", 4, "--resume", "--out", killed])
with open(os.path.join(killed, "ensemble.json")) as f:
    mk = json.load(f)
check(mk["members"] == manifest["members"][:2] and all(
    same_checkpoint(os.path.join(killed, m), os.path.join(out, m)) for m in mk["members"]),
    "resumed after a kill: both members bitwise those of the run never stopped")

# dp2: same members, same decisions on both ranks.
dp2 = fresh_dir("ensemble_dp2")
mpirun(2, common + ["--ensemble", 2, "--out", dp2])
with open(os.path.join(dp2, "ensemble.json")) as f:
    m2 = json.load(f)
check(m2["members"] == manifest["members"][:2] and m2["seeds"] == [5, 6],
      f"dp2 ensemble.json: {m2}")
ev2, _ = run(["eval", "--checkpoint", out + "/member_1/step_00000012", out +
              "/member_2/step_00000012", "--data", data, "--threads", 1])
check(rel_err(m2["val_loss"], json.loads(ev2)["loss"]) < 1e-4,
      f"dp2 ensemble val loss {m2['val_loss']} equals dp1's two members {json.loads(ev2)['loss']}")

# Bad input.
expect_error(common + ["--ensemble", 0, "--out", fresh_dir("bad0")], "ensemble", ">= 1")
corpus = os.path.join(tmp, "corpus.txt")
write_text_corpus(corpus)
shard = os.path.join(tmp, "corpus.bin")
run(["prepare", "--input", corpus, "--out", shard])
expect_error(["train", "--model", "baby", "--data", shard, "--ensemble", 2, "--steps", 2,
              "--out", fresh_dir("bad_lm")], "ensemble 2", "classif", shard)
expect_error(common + ["--ensemble", 2, "--stop-at", 4, "--out", fresh_dir("bad_stop")],
             "ensemble 2", "stop_at")
expect_error(["eval", "--checkpoint", members[0], members[1], "--data", shard],
             "2 checkpoints", "token shard")
broken = fresh_dir("broken")
with open(os.path.join(broken, "ensemble.json"), "w") as f:
    f.write('{"members": 3}')
expect_error(["eval", "--checkpoint", broken, "--data", data], "ensemble.json", "members")
with open(os.path.join(broken, "ensemble.json"), "w") as f:
    f.write('{"members": ["member_1/best", 3]}')
expect_error(["eval", "--checkpoint", broken, "--data", data], "ensemble.json", "3",
             "not a directory name")
other_tsv = os.path.join(tmp, "other.tsv")
with open(other_tsv, "w") as f:
    f.write("sentence\tlabel\n" + "".join(f"word {i}\t{'xy'[i % 2]}\n" for i in range(40)))
other = os.path.join(tmp, "other")
run(["prepare", "--task", "classify", "--input", other_tsv, "--out", other])
other_out = fresh_dir("other_run")
run(["train", "--model", "encoder-tiny", "--data", other, "--steps", 2, "--threads", 1, "--quiet",
     "--tensorboard", "false", "--out", other_out])
expect_error(["classify", "--checkpoint", members[0], os.path.join(other_out, "step_00000002"),
              "--input", texts], "classes differ")
print("ok")
