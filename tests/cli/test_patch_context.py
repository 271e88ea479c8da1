"""`patch_context` (each image patch's input also holds its neighbours: an overlapping patch
embedding, train/batches.h SequenceFormat) end to end, on tiny idx images (8x12 pixels in 4x3
patches: a 2x4 grid) prepared with `prepare --task classify`:

- the checkpoint records it: config.json's input_features is 12 values x 9 patches, and its task
  names patch_context 1;
- `eval` rebuilds the same inputs from that record: on the checkpoint of the last step it gives
  the validation accuracy training logged there, and the loss to 1e-5 (with patch_context taken
  away from the record, it refuses the checkpoint, exit 2: the inputs would not fit the model);
- a 2-member ensemble (`ensemble = 2`) reports in ensemble.json what `eval` of it gives;
- the inputs do not depend on the layout: with augmentation (the neighbours are cut from the
  augmented image), a dp2 run equals the 1-process run to <= 1e-5 (losses, validation losses,
  final parameters);
- bad values exit 2 naming the key: out of range, text (token) data, language-model data, a task
  directory prepared without the image sizes; and `eval` of the checkpoint on such a directory.

The inputs themselves are checked against PyTorch's conv2d of the whole image in
tests/reference/test_torch_oracle_tasks.py (case h)."""
import json
import os
import shutil

from trellis_test import (LayoutCheck, TMP, check, expect_error, fresh_dir, metrics,
                          prepare_task_dirs, run, write_idx_dir)

idx = os.path.join(fresh_dir("idx"), "images")
write_idx_dir(idx, rows=8, cols=12, n_train=24, n_test=8)
img = os.path.join(TMP, "img")
run(["prepare", "--task", "classify", "--input", idx, "--out", img, "--patch", "4x3"])

STEPS = 6
common = ["train", "--model", "encoder-tiny", "--data", img, "--batch-size", 8, "--lr", 1e-3,
          "--warmup-steps", 2, "--threads", 1, "--quiet", "--tensorboard", "false",
          "--steps", STEPS, "--val-every", 3, "--patch-context", 1]

# The record and eval.
out = fresh_dir("context")
run(common + ["--out", out])
ck = os.path.join(out, f"step_{STEPS:08d}")
with open(os.path.join(ck, "config.json")) as f:
    config = json.load(f)
task = config["trellis"]["task"]
check(task.get("patch_context") == 1 and task.get("feature_dim") == 12,
      f"the checkpoint records patch_context 1 over 12-value patches ({task})")
check(config["trellis"]["blocks"].get("input_features") == 12 * 9,
      f"the model projects 9 patches of 12 values ({config['trellis']['blocks']})")
_, val = metrics(out)
last = [v for v in val if v["step"] == STEPS]
check(len(last) == 1, f"training validated at step {STEPS} ({[v['step'] for v in val]})")
stdout, _ = run(["eval", "--checkpoint", ck, "--data", img, "--batch-size", 3])
got = json.loads(stdout.strip().splitlines()[-1])
want = last[0]
check(got["accuracy"] == want["val_accuracy"] and
      abs(got["loss"] - want["val_loss"]) <= 1e-5 * abs(want["val_loss"]),
      f"eval rebuilds the training's inputs: loss {got['loss']:.7f} accuracy {got['accuracy']} "
      f"(training's validation {want['val_loss']:.7f}, {want['val_accuracy']})")
stripped = fresh_dir("stripped")
shutil.rmtree(stripped)
shutil.copytree(ck, stripped)
del config["trellis"]["task"]["patch_context"]
with open(os.path.join(stripped, "config.json"), "w") as f:
    json.dump(config, f)
expect_error(["eval", "--checkpoint", stripped, "--data", img], "reads 108 input features",
             "gives 12", what="a model whose task record lost patch_context")

# An ensemble trained with it reports, in ensemble.json, what eval of its members gives.
ens = fresh_dir("context_ensemble")
run(common + ["--ensemble", 2, "--out", ens])
with open(os.path.join(ens, "ensemble.json")) as f:
    manifest = json.load(f)
stdout, _ = run(["eval", "--checkpoint", ens, "--data", img])
got = json.loads(stdout.strip().splitlines()[-1])
check(got["accuracy"] == manifest["val_accuracy"] and
      abs(got["loss"] - manifest["val_loss"]) <= 1e-5 * abs(manifest["val_loss"]),
      f"the training's ensemble report equals eval of its members (accuracy {got['accuracy']}, "
      f"loss {got['loss']:.7f} against {manifest['val_loss']:.7f})")

# Layouts, with augmentation: the same neighbours on every rank.
lc = LayoutCheck(common + ["--augment", "shift:2,flip"], n_embd=32, steps=STEPS,
                 name="context_baseline")
lc.check("context_dp2", 2, ["--dp", 2])

# Bad values: exit 2, one line naming the key.
cls_dir, _ = prepare_task_dirs()
old = fresh_dir("img_old")
for name in ("train.examples", "val.examples"):
    shutil.copy(os.path.join(img, name), os.path.join(old, name))
with open(os.path.join(img, "meta.json")) as f:
    meta = json.load(f)
del meta["image"]
with open(os.path.join(old, "meta.json"), "w") as f:
    json.dump(meta, f)
bad = {
    "out of range": (["--data", img, "--patch-context", 4], "outside [0, 4)"),
    "negative": (["--data", img, "--patch-context", -1], "outside [0, 4)"),
    "text data": (["--data", cls_dir, "--patch-context", 1], "token examples"),
    "language-model data": (["--model", "tiny", "--patch-context", 1], "language-model shards"),
    "old task directory": (["--data", old, "--patch-context", 1], "prepare the data again"),
}
for what, (extra, needle) in bad.items():
    model = [] if "--model" in extra else ["--model", "encoder-tiny"]
    expect_error(["train", *model, "--steps", 1, "--out", fresh_dir("bad"), *extra],
                 "patch_context", needle, what=what)
expect_error(["eval", "--checkpoint", ck, "--data", old], "patch_context", old,
             what="eval on images without their sizes")
