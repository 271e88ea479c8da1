"""Augmentation of image tasks (`augment = "shift:N,flip"`, data/augment.h) end to end, on tiny
idx images (8x12 pixels in 4x3 patches, random bytes) prepared with `prepare --task classify`:

- it changes what is trained on (the first step's loss differs from a run without it) and
  training examples only: with lr 0 the validation losses equal the unaugmented run's;
- it is a function of (seed, epoch, example), not of the layout: dp2 and pp2 (1F1B) runs with
  augmentation equal the 1-process run to <= 1e-5 (losses, validation losses, final
  parameters), and keep OUT/best at the same step;
- a run stopped and resumed is bitwise equal to an uninterrupted one (4 epochs of 3 steps, so
  the resumed run continues the draws of later epochs), OUT/best included;
- bad values exit 2 naming the key: an unknown operation, a shift out of range, augmentation
  of text (token) data and of language-model data, a task directory prepared without the image
  sizes.

The augmentation itself (offsets, flip, zero fill, patch order) is checked against an
independent implementation in tests/unit/test_augment.cpp."""
import json
import os

from trellis_test import (LayoutCheck, TMP, check, fresh_dir, metrics, prepare_task_dirs, run,
                          same_checkpoint, stop_and_resume, write_idx_dir)

idx = os.path.join(fresh_dir("idx"), "images")
write_idx_dir(idx, rows=8, cols=12, n_train=24, n_test=8)
img = os.path.join(TMP, "img")
run(["prepare", "--task", "classify", "--input", idx, "--out", img, "--patch", "4x3"])
with open(os.path.join(img, "meta.json")) as f:
    meta = json.load(f)
check(meta.get("image") == {"height": 8, "width": 12, "patch_height": 4, "patch_width": 3},
      f"meta.json records the image and patch sizes ({meta.get('image')})")

common = ["train", "--model", "encoder-tiny", "--data", img, "--batch-size", 8,
          "--micro-batch-size", 2, "--lr", 1e-3, "--warmup-steps", 2, "--threads", 1, "--quiet",
          "--tensorboard", "false"]
AUG = ["--augment", "shift:2,flip"]


def train(name, args):
    out = fresh_dir(name)
    run(common + args + ["--out", out])
    return metrics(out)


# What it trains on: the first step's loss moves; with lr 0, validation is untouched.
plain, _ = train("plain", ["--steps", 1])
aug, _ = train("aug", ["--steps", 1] + AUG)
check(plain[0]["loss"] != aug[0]["loss"],
      f"augmentation changes the training inputs (step 1 loss {plain[0]['loss']:.6f} vs "
      f"{aug[0]['loss']:.6f})")
frozen = ["--steps", 6, "--lr", 0, "--min-lr", 0, "--val-every", 3]
(pt, pv), (at, av) = train("plain_lr0", frozen), train("aug_lr0", frozen + AUG)
check(pv == av and len(pv) == 2, "validation is never augmented (lr 0: equal validation metrics)")
check(any(a["loss"] != b["loss"] for a, b in zip(pt, at)), "while the training losses differ")
flip_only, _ = train("flip", ["--steps", 1, "--augment", "flip"])
shift_only, _ = train("shift", ["--steps", 1, "--augment", "shift:1"])
check(len({plain[0]["loss"], flip_only[0]["loss"], shift_only[0]["loss"]}) == 3,
      "flip and shift each change the inputs")

# Layouts: the draws do not depend on the rank.
STEPS = 12
args = common + AUG + ["--steps", STEPS, "--val-every", 3, "--keep-best", "val_loss"]
lc = LayoutCheck(args, n_embd=32, steps=STEPS, name="aug_baseline")


def best_step(out):
    with open(os.path.join(out, "best", "state.json")) as f:
        return json.load(f)["step"]


base_best = best_step(os.path.join(TMP, "aug_baseline"))
for name, ranks, extra in (("aug_dp2", 2, ["--dp", 2]),
                           ("aug_pp2", 2, ["--pp", 2, "--schedule", "1f1b"])):
    lc.check(name, ranks, extra)
    check(best_step(os.path.join(TMP, name)) == base_best,
          f"{name}: OUT/best from the same step ({base_best})")

# Resume: 24 examples, batch 8: 3 steps an epoch; stopped inside the second epoch.
resume_args = common + AUG + ["--steps", 12, "--val-every", 2, "--save-every", 4,
                              "--keep-best", "val_accuracy"]
full, split = stop_and_resume(resume_args, stop_at=5, steps=12, what="aug_resume")
check(best_step(full) == best_step(split) and
      same_checkpoint(os.path.join(full, "best"), os.path.join(split, "best")),
      f"aug_resume: OUT/best of the same step ({best_step(full)}) bitwise equal")

# Bad values: exit 2, one line naming the key.
cls_dir, _ = prepare_task_dirs()
old = fresh_dir("img_old")
for name in ("train.examples", "val.examples"):
    with open(os.path.join(img, name), "rb") as src, open(os.path.join(old, name), "wb") as dst:
        dst.write(src.read())
old_meta = dict(meta)
del old_meta["image"]
with open(os.path.join(old, "meta.json"), "w") as f:
    json.dump(old_meta, f)
bad = {
    "unknown operation": (["--data", img, "--augment", "rotate:10"],
                          "unknown operation 'rotate:10'"),
    "shift out of range": (["--data", img, "--augment", "shift:8"], "out of range"),
    "shift zero": (["--data", img, "--augment", "shift:0"], "out of range"),
    "text data": (["--data", cls_dir, "--augment", "flip"], "image"),
    "language-model data": (["--model", "tiny", "--augment", "shift:1"], "image"),
    "old task directory": (["--data", old, "--augment", "flip"], "prepare the data again"),
}
for what, (extra, needle) in bad.items():
    _, err = run(["train", "--model", "encoder-tiny", "--steps", 1, "--out", fresh_dir("bad")] +
                 extra, expect=2)
    line = err.strip()
    check("augment" in line and needle in line and len(line.splitlines()) == 1,
          f"{what}: exit 2 naming augment ({line})")
