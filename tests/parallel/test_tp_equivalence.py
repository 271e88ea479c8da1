"""Tensor parallelism (Megatron-style, with and without sequence parallelism, alone and with data
parallelism and ZeRO-1) under mpirun equals the 1-process run: per-step losses over 20 steps and
final parameters to <= 1e-5 relative (fp32); so does tp2 (with and without sequence parallelism)
with label smoothing, whose vocabulary-parallel loss needs every rank's logit sums."""
import json
import os

from trellis_test import (LayoutCheck, check, compare_params, fresh_dir, mpirun, run,
                          write_text_corpus, TMP)

corpus = fresh_dir("corpus")
write_text_corpus(os.path.join(corpus, "text.txt"), n_lines=800)
data = os.path.join(TMP, "data")
run(["prepare", "--input", corpus, "--out", data])
# 4 heads so that tp = 4 splits them; vocabulary 256 so that each tp rank holds 64 or 128 rows.
common = ["train", "--model", "tiny", "--n-head", 4, "--data", data, "--steps", 20,
          "--batch-size", 8, "--seq-len", 32, "--lr", 3e-3, "--warmup-steps", 4,
          "--val-every", 10, "--threads", 1, "--quiet", "--tensorboard", "false"]
layouts = LayoutCheck(common, n_embd=32, steps=20)

for tp in (2, 4):
    for sp in (False, True):
        name = f"tp{tp}" + ("_sp" if sp else "")
        layouts.check(name, tp, ["--tp", tp] + (["--sequence-parallel"] if sp else []))
for sp in (False, True):
    name = "tp2_dp2" + ("_sp" if sp else "")
    layouts.check(name, 4, ["--tp", 2, "--dp", 2] + (["--sequence-parallel"] if sp else []))
layouts.check("tp2_dp2_zero1_micro2", 4, ["--tp", 2, "--dp", 2, "--zero", 1,
                                          "--micro-batch-size", 2, "--sequence-parallel"])

# Label smoothing under the vocabulary-parallel cross-entropy: each rank holds a slice of the
# vocabulary, and rows padded to a multiple of 96 * tp (1 process: 256 of 288 rows real; tp2:
# rank 0 holds 192 real rows, rank 1 64 real and 128 padding), so the smoothing's mean over the
# true vocabulary needs the logit sums of both ranks and must skip every padding row.
smooth = LayoutCheck(common + ["--label-smoothing", 0.1, "--vocab-multiple", 96], n_embd=32,
                     steps=20, name="smooth_baseline")
diff = abs(smooth.base[0][-1] - layouts.base[0][-1]) / layouts.base[0][-1]
check(diff > 1e-3, f"label smoothing 0.1 changes the last step's loss ({diff:.1e}), so it is on")
smooth.check("smooth_tp2", 2, ["--tp", 2])
smooth.check("smooth_tp2_sp", 2, ["--tp", 2, "--sequence-parallel"])

# Impossible layouts are refused before any work.
_, err = mpirun(2, common + ["--tp", 2, "--n-head", 3, "--n-embd", 48, "--out", fresh_dir("b1")],
                expect=2)
check("tp=2 does not divide the number of heads 3" in err, "tp must divide the heads")
_, err = mpirun(4, common + ["--tp", 4, "--sequence-parallel", "--seq-len", 30,
                             "--out", fresh_dir("b2")], expect=2)
check("seq_len 30 divisible by tp=4" in err, "sequence parallelism needs seq_len % tp == 0")

# Checkpoints move between layouts: 10 steps under tp=2 x dp=2 with ZeRO-1, then resume as
# 1 process; the result equals the 1-process run.
out = fresh_dir("moved")
mpirun(4, common + ["--tp", 2, "--dp", 2, "--zero", 1, "--stop-at", 10, "--out", out])
run(common + ["--resume", "--out", out])
loss, _, params = layouts._result(out)
worst = max(abs(a - b) / abs(b) for a, b in zip(loss, layouts.base[0]))
check(worst <= 1e-5, f"tp2 x dp2 checkpoint resumed by 1 process: losses match ({worst:.1e})")
worst_p, where, whole = compare_params(params, layouts.base[2], 32)
check(worst_p <= 1e-5 and whole <= 1e-5,
      f"... and final parameters match (worst {worst_p:.1e} in {where})")

# Evaluation and sampling work on checkpoints written under tensor parallelism (global tensors).
val_shard = os.path.join(data, "val_000000.bin")
losses = {}
for name in ("baseline", "tp2_sp"):
    out, _ = run(["eval", "--checkpoint", os.path.join(TMP, name, "step_00000020"), "--data",
                  val_shard, "--seq-len", 32, "--batch-size", 2, "--batches", 2])
    losses[name] = json.loads(out)["loss"]
rel = abs(losses["tp2_sp"] - losses["baseline"]) / losses["baseline"]
check(rel <= 1e-5, f"eval of the tp2 checkpoint equals the baseline's ({rel:.1e})")
text, _ = run(["sample", "--checkpoint", os.path.join(TMP, "tp2_sp", "step_00000020"),
               "--prompt", "the", "--tokens", 10, "--temperature", 0])
ref, _ = run(["sample", "--checkpoint", os.path.join(TMP, "baseline", "step_00000020"),
              "--prompt", "the", "--tokens", 10, "--temperature", 0])
check(text == ref, "greedy samples from the tp2 checkpoint equal the baseline's")
