"""Dropout in one process: a resumed run draws the same masks (bitwise resume), validation draws
none, recompute redraws the first pass's masks, and bf16 runs it too.
  - resume: 12 steps in one go == 6, stop, resume for 6 (losses, validation losses, parameters and
    optimizer state bitwise), with dropout, attn_dropout and gradient accumulation;
  - validation: with lr 0 the weights never move, so a run with dropout 0.5 must log bitwise the
    validation losses of the run without dropout, while its training losses differ (the masks are
    drawn in training forwards only, also on Contexts the validation reuses);
  - recompute selective and full: bitwise the run without recompute;
  - precision bf16 (emulated matrix products where the CPU lacks AVX512-BF16): trains with
    dropout, its losses differ from the run without, and selective recompute is bitwise equal to
    none there.
The multi-rank layouts are tests/parallel/test_dropout_layouts.py's."""
import math
import os

from trellis_test import (TMP, check, fresh_dir, metrics, run, same_checkpoint, stop_and_resume,
                          write_text_corpus)

corpus = fresh_dir("corpus")
write_text_corpus(os.path.join(corpus, "text.txt"))
data = os.path.join(TMP, "data")
run(["prepare", "--input", corpus, "--out", data])
base = ["train", "--model", "tiny", "--data", data, "--batch-size", 4, "--micro-batch-size", 2,
        "--seq-len", 32, "--lr", 3e-3, "--warmup-steps", 3, "--val-every", 4, "--val-batches", 1,
        "--threads", 1, "--quiet", "--tensorboard", "false"]
drop = ["--dropout", 0.2, "--attn-dropout", 0.2]

stop_and_resume(base + drop + ["--steps", 12], 6, 12, "resume")


def losses(args, name):
    out = fresh_dir(name)
    run(args + ["--out", out])
    train, val = metrics(out)
    return [r["loss"] for r in train], [v["val_loss"] for v in val], out


frozen = base + ["--steps", 4, "--lr", 0, "--min-lr", 0, "--val-every", 1]
l0, v0, _ = losses(frozen, "frozen_plain")
l1, v1, _ = losses(frozen + ["--dropout", 0.5, "--attn-dropout", 0.5], "frozen_dropout")
check(len(v0) == 4 and v0 == v1,
      f"validation draws no masks: val losses bitwise equal ({v0[-1]!r})")
check(all(a != b for a, b in zip(l0, l1)), "training draws masks: every training loss differs")

ref_l, ref_v, ref_out = losses(base + drop + ["--steps", 6], "recompute_none")
for mode in ("selective", "full"):
    l, v, out = losses(base + drop + ["--steps", 6, "--recompute", mode], f"recompute_{mode}")
    check(l == ref_l and v == ref_v, f"recompute {mode}: losses bitwise equal to none")
    check(same_checkpoint(os.path.join(ref_out, "step_00000006"),
                          os.path.join(out, "step_00000006")),
          f"recompute {mode}: parameters and optimizer state bitwise equal to none")

bf16 = base + ["--steps", 6, "--precision", "bf16"]
p_l, _, _ = losses(bf16, "bf16_plain")
d_l, d_v, _ = losses(bf16 + drop, "bf16_dropout")
s_l, s_v, _ = losses(bf16 + drop + ["--recompute", "selective"], "bf16_selective")
check(all(math.isfinite(x) for x in d_l) and d_l != p_l, "bf16: trains with dropout")
check(s_l == d_l and s_v == d_v, "bf16: selective recompute bitwise equal to none with dropout")
print("dropout: all checks passed")
