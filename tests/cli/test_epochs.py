"""Counting a run in epochs of a task's training set (`epochs`, `val_per_epoch`), so one recipe
fits data sets of any size:

- epochs = E trains ceil(E x examples / batch_size) steps, val_per_epoch = V validates every
  round(examples / batch_size / V) steps (the counts derived here from the data's meta.json);
- a count given on the command line wins over the other unit from the config file, whichever way
  round, and --set counts as the command line;
- bad values exit 2 naming the key: negative, or epochs on a language model's corpus."""
import json
import math
import os

from trellis_test import TMP, check, expect_error, fresh_dir, metrics, prepare_task_dirs, run

cls_dir, _ = prepare_task_dirs()
with open(os.path.join(cls_dir, "meta.json")) as f:
    n_train = json.load(f)["train_examples"]
check(n_train > 0, f"the classification data has training examples ({n_train})")
batch = 8
common = ["train", "--model", "encoder-tiny", "--data", cls_dir, "--batch-size", batch,
          "--threads", 1, "--quiet", "--tensorboard", "false"]


def steps_and_vals(out):
    steps, vals = metrics(out)
    return [s["step"] for s in steps], [v["step"] for v in vals]


# epochs and val_per_epoch from flags.
out = fresh_dir("flags")
run(common + ["--epochs", 1.3, "--val-per-epoch", 2, "--out", out])
steps, vals = steps_and_vals(out)
want_steps = math.ceil(1.3 * n_train / batch)
every = round(n_train / batch / 2)
check(steps and steps[-1] == want_steps and len(steps) == want_steps,
      f"epochs 1.3 of {n_train} examples at batch {batch}: {want_steps} steps (got {steps[-1:]})")
want_vals = [s for s in range(every, want_steps + 1, every)]
if want_vals[-1] != want_steps:
    want_vals.append(want_steps)  # and at the end
check(vals == want_vals, f"val_per_epoch 2: validations at {want_vals} (got {vals})")

# A config file's epochs against the command line's steps, and the other way round.
cfg = os.path.join(TMP, "epochs.toml")
with open(cfg, "w") as f:
    f.write("epochs = 2\nval_per_epoch = 1\n")
out = fresh_dir("file_epochs")
run(common + ["--config", cfg, "--out", out])
steps, vals = steps_and_vals(out)
check(steps[-1] == math.ceil(2 * n_train / batch), f"the file's epochs = 2 sets the steps ({steps[-1]})")
for given in (["--steps", 3], ["--set", "steps=3"]):
    out = fresh_dir("cli_steps")
    run(common + ["--config", cfg, "--val-every", 1, "--out", out] + given)
    steps, vals = steps_and_vals(out)
    check(steps == [1, 2, 3] and vals == [1, 2, 3],
          f"{given} and --val-every 1 on the command line win over the file's epochs and "
          f"val_per_epoch (steps {steps}, validations {vals})")
with open(cfg, "w") as f:
    f.write("steps = 3\n")
out = fresh_dir("cli_epochs")
run(common + ["--config", cfg, "--epochs", 1, "--val-every", 0, "--out", out])
steps, _ = steps_and_vals(out)
check(steps[-1] == math.ceil(n_train / batch), f"--epochs 1 wins over the file's steps ({steps[-1]})")

# Bad values.
expect_error(common + ["--epochs", -1, "--out", fresh_dir("neg")], "'epochs'", "-1", ">= 0",
             what="negative epochs")
expect_error(common + ["--val-per-epoch", -2, "--out", fresh_dir("neg2")], "'val_per_epoch'",
             what="negative val_per_epoch")
expect_error(["train", "--epochs", 1, "--quiet", "--out", fresh_dir("lm")], "'epochs'",
             "task's training examples", "the built-in corpus", "steps",
             what="epochs on a language model")
print("ok")
