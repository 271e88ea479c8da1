"""Best checkpoint (`keep_best`) and early stopping (`early_stop_patience`), train/best.h:

- a classification run with keep_best = val_accuracy (and val_macro_f1, val_loss) keeps OUT/best
  whose state.json names the step of the first best logged value (ties keep the earlier step),
  bitwise equal to that step's own checkpoint, rewritten atomically (no temporary directory
  left); `eval`, `classify` and `export` take --checkpoint OUT/best, and eval reports the
  accuracy logged for that step;
- a language model with keep_best = val_loss: `sample` and `eval` take OUT/best; a translation
  model: `translate` takes it;
- under dp2 every rank takes the same decisions (same best step, same early stop);
- early_stop_patience stops at the step the logged metrics give (re-derived here), with the
  final checkpoint of that step; with lr 0 (no improvement possible) exactly at validation
  1 + patience; a resumed early-stopped run trains no further;
- bad values exit 2 naming the key: an unknown metric, val_accuracy / val_macro_f1 on a language
  model, a negative patience, a patience without keep_best."""
import json
import os
import subprocess

from trellis_test import (BIN, check, checkpoint_bytes, fresh_dir, metrics, mpirun,
                          prepare_task_dirs, run, same_checkpoint, write_text_corpus)

cls_dir, mt_dir = prepare_task_dirs()
common = ["train", "--model", "encoder-tiny", "--data", cls_dir, "--batch-size", 8, "--lr", 3e-3,
          "--warmup-steps", 2, "--threads", 1, "--quiet", "--tensorboard", "false"]


def state(ck):
    with open(os.path.join(ck, "state.json")) as f:
        return json.load(f)


def expected(vals, metric, patience=0):
    """The best step and the step early stopping ends at (None: none), from the logged values."""
    best, best_step, since = None, None, 0
    for v in vals:
        x = v[metric]
        better = best is None or (x < best if metric == "val_loss" else x > best)
        if better:
            best, best_step, since = x, v["step"], 0
        else:
            since += 1
            if patience and since >= patience:
                return best_step, best, v["step"]
    return best_step, best, None


# keep_best on a classifier, each metric.
for metric in ("val_accuracy", "val_macro_f1", "val_loss"):
    out = fresh_dir(f"best_{metric}")
    run(common + ["--steps", 24, "--val-every", 2, "--save-every", 2, "--keep-best", metric,
                  "--out", out])
    _, vals = metrics(out)
    step, value, _ = expected(vals, metric)
    s = state(os.path.join(out, "best"))
    check(s["step"] == step and s["best"]["step"] == step and s["best"]["value"] == value and
          s["best"]["metric"] == metric,
          f"{metric}: OUT/best is step {step}, the first best of {[v[metric] for v in vals]}")
    check(same_checkpoint(os.path.join(out, "best"), os.path.join(out, f"step_{step:08d}")),
          f"{metric}: OUT/best holds that step's parameters and optimizer state")
    check(not any(n.startswith(".") for n in os.listdir(out)),
          f"{metric}: no temporary directory left ({sorted(os.listdir(out))})")
    if metric == "val_accuracy":
        check(step > vals[0]["step"], f"{metric}: the best moved past the first validation")
        ev, _ = run(["eval", "--checkpoint", os.path.join(out, "best"), "--data", cls_dir])
        got = json.loads(ev)
        check(got["accuracy"] == value, f"eval --checkpoint OUT/best: accuracy {got['accuracy']} "
              f"as logged at step {step}")
        texts = os.path.join(out, "texts.txt")
        with open(texts, "w") as f:
            f.write("bright warm day\ncold grim film\n")
        cl, _ = run(["classify", "--checkpoint", os.path.join(out, "best"), "--input", texts])
        check(len(cl.strip().splitlines()) == 2, "classify --checkpoint OUT/best labels 2 lines")
        run(["export", "--checkpoint", os.path.join(out, "best"), "--out",
             os.path.join(out, "hf")])
        check(os.path.exists(os.path.join(out, "hf", "config.json")),
              "export --checkpoint OUT/best writes a Hugging Face directory")
        base_out, base_vals, base_step = out, vals, step

# dp2: the same decisions on every rank.
out = fresh_dir("best_dp2")
mpirun(2, common + ["--steps", 24, "--val-every", 2, "--save-every", 2, "--keep-best",
                    "val_accuracy", "--dp", 2, "--out", out])
check(state(os.path.join(out, "best"))["step"] == base_step,
      f"dp2: OUT/best from the same step ({base_step}) as one process")

# A language model and a translation model.
corpus = os.path.join(fresh_dir("lm_inputs"), "corpus.txt")
write_text_corpus(corpus)
lm_data = fresh_dir("lm_data")
run(["prepare", "--input", corpus, "--out", lm_data])
lm = fresh_dir("best_lm")
run(["train", "--model", "tiny", "--data", lm_data, "--steps", 8, "--val-every", 2,
     "--keep-best", "val_loss", "--threads", 1, "--quiet", "--tensorboard", "false", "--out", lm])
_, lm_vals = metrics(lm)
check(state(os.path.join(lm, "best"))["step"] == expected(lm_vals, "val_loss")[0],
      "language model: OUT/best at the lowest val_loss")
# (an 8-step byte model's text need not be UTF-8: read it as bytes)
p = subprocess.run([BIN, "sample", "--checkpoint", os.path.join(lm, "best"), "--tokens", "8"],
                   capture_output=True)
check(p.returncode == 0 and len(p.stdout) > 0,
      "sample --checkpoint OUT/best" + ("" if p.returncode == 0 else f": {p.stderr[-300:]}"))
val_shard = sorted(n for n in os.listdir(lm_data) if n.startswith("val") and n.endswith(".bin"))[0]
ev, _ = run(["eval", "--checkpoint", os.path.join(lm, "best"), "--data",
             os.path.join(lm_data, val_shard)])
check("loss" in json.loads(ev), "eval --checkpoint OUT/best on a token shard")
mt = fresh_dir("best_mt")
run(["train", "--model", "encdec-tiny", "--data", mt_dir, "--steps", 6, "--val-every", 3,
     "--keep-best", "val_loss", "--threads", 1, "--quiet", "--tensorboard", "false", "--out", mt])
src = os.path.join(mt, "src.txt")
with open(src, "w") as f:
    f.write("red cat\n")
tr, _ = run(["translate", "--checkpoint", os.path.join(mt, "best"), "--input", src])
check(tr.count("\n") == 1, "translate --checkpoint OUT/best: one line out")

# Early stopping at the step the logged metrics give.
for patience in (1, 2):
    out = fresh_dir(f"early_{patience}")
    run(common + ["--steps", 40, "--val-every", 2, "--keep-best", "val_accuracy",
                  "--early-stop-patience", patience, "--out", out])
    train_rows, vals = metrics(out)
    step, value, stop = expected(vals, "val_accuracy", patience)
    check(stop is not None and train_rows[-1]["step"] == stop and vals[-1]["step"] == stop,
          f"patience {patience}: stops at step {stop} ({[v['val_accuracy'] for v in vals]})")
    check(os.path.isdir(os.path.join(out, f"step_{stop:08d}")) and
          state(os.path.join(out, "best"))["step"] == step,
          f"patience {patience}: final checkpoint step {stop}, OUT/best step {step}")
# No improvement possible: validations at 2 (the first best), 4, 6, 8: stop at 8.
out = fresh_dir("early_lr0")
lr0 = common + ["--steps", 40, "--lr", 0, "--min-lr", 0, "--val-every", 2, "--keep-best",
                "val_loss", "--early-stop-patience", 3, "--out", out]
run(lr0)
train_rows, vals = metrics(out)
check(train_rows[-1]["step"] == 8 and [v["step"] for v in vals] == [2, 4, 6, 8] and
      sorted(n for n in os.listdir(out) if n.startswith("step_")) == ["step_00000008"] and
      state(os.path.join(out, "best"))["step"] == 2,
      "lr 0, patience 3: stops at step 8 with step_00000008 and OUT/best of step 2")
before = checkpoint_bytes(os.path.join(out, "step_00000008"))
stdout, _ = run([a for a in lr0 if a != "--quiet"] + ["--resume"])
train_rows, _ = metrics(out)
check(train_rows[-1]["step"] == 8 and "early stopping ended this run" in stdout and
      checkpoint_bytes(os.path.join(out, "step_00000008")) == before,
      "resumed after an early stop: trains no further")
out = fresh_dir("early_dp2")
mpirun(2, lr0[:-2] + ["--dp", 2, "--out", out])
check(metrics(out)[0][-1]["step"] == 8, "dp2: every rank stops at step 8")

# Bad values: exit 2, one line naming the key.
bad = {
    "unknown metric": (common + ["--keep-best", "val_bleu"], "keep_best"),
    "val_accuracy on a language model": (["train", "--model", "tiny", "--keep-best",
                                          "val_accuracy"], "keep_best"),
    "val_macro_f1 on a language model": (["train", "--model", "tiny", "--keep-best",
                                          "val_macro_f1"], "keep_best"),
    "negative patience": (common + ["--keep-best", "val_loss", "--early-stop-patience", -1],
                          "early_stop_patience"),
    "patience without keep_best": (common + ["--early-stop-patience", 2], "early_stop_patience"),
}
for what, (args, key) in bad.items():
    _, err = run(args + ["--steps", 1, "--out", fresh_dir("bad")], expect=2)
    line = err.strip()
    check(key in line and len(line.splitlines()) == 1, f"{what}: exit 2 naming {key} ({line})")
