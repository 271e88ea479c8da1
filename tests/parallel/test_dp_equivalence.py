"""Data parallelism (+ ZeRO-1, + accumulation) under mpirun equals the 1-process run: per-step
losses over 20 steps and final parameters to <= 1e-5 relative (fp32)."""
import os

from trellis_test import LayoutCheck, check, fresh_dir, mpirun, run, write_text_corpus, TMP

corpus = fresh_dir("corpus")
write_text_corpus(os.path.join(corpus, "text.txt"), n_lines=800)
data = os.path.join(TMP, "data")
run(["prepare", "--input", corpus, "--out", data])
common = ["train", "--model", "tiny", "--data", data, "--steps", 20, "--batch-size", 8,
          "--seq-len", 32, "--lr", 3e-3, "--warmup-steps", 4, "--val-every", 10,
          "--threads", 1, "--quiet", "--tensorboard", "false", "--bucket-mb", 0.01]
layouts = LayoutCheck(common, n_embd=32, steps=20)

for dp in (2, 4):
    for zero in (0, 1):
        for micro in (None, 1):
            name = f"dp{dp}_zero{zero}" + (f"_micro{micro}" if micro else "")
            args = ["--dp", dp, "--zero", zero] + (["--micro-batch-size", micro] if micro else [])
            layouts.check(name, dp, args)

# Bad layouts fail before any work, on every rank, with one clear message.
_, err = mpirun(2, common + ["--dp", 3, "--out", fresh_dir("bad")], expect=2)
check("does not match the world size 2" in err, "dp that does not fit the world is refused")
