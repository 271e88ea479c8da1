"""Data parallelism (+ ZeRO-1, + accumulation) under mpirun equals the 1-process run: per-step
losses over 20 steps and final parameters to <= 1e-5 relative (fp32)."""
import os

from trellis_test import (check, compare_params, fresh_dir, metrics, mpirun, read_safetensors,
                          run, write_text_corpus, TMP)

TOL = 1e-5
corpus = fresh_dir("corpus")
write_text_corpus(os.path.join(corpus, "text.txt"), n_lines=800)
data = os.path.join(TMP, "data")
run(["prepare", "--input", corpus, "--out", data])
common = ["train", "--model", "tiny", "--data", data, "--steps", 20, "--batch-size", 8,
          "--seq-len", 32, "--lr", 3e-3, "--warmup-steps", 4, "--val-every", 10,
          "--threads", 1, "--quiet", "--tensorboard", "false", "--bucket-mb", 0.01]


def result(out):
    train, val = metrics(out)
    return ([r["loss"] for r in train], [v["val_loss"] for v in val],
            read_safetensors(os.path.join(out, "step_00000020", "model.safetensors")))


base_out = fresh_dir("base")
run(common + ["--out", base_out])
base_loss, base_val, base_params = result(base_out)

for dp in (2, 4):
    for zero in (0, 1):
        for micro in (None, 1):
            name = f"dp{dp}_zero{zero}" + (f"_micro{micro}" if micro else "")
            out = fresh_dir(name)
            extra = ["--dp", dp, "--zero", zero, "--out", out]
            if micro:
                extra += ["--micro-batch-size", micro]
            mpirun(dp, common + extra)
            loss, val, params = result(out)
            check(len(loss) == 20, f"{name}: 20 steps logged")
            worst = max(abs(a - b) / abs(b) for a, b in zip(loss, base_loss))
            check(worst <= TOL, f"{name}: losses match the 1-process run (worst {worst:.1e})")
            worst_val = max(abs(a - b) / abs(b) for a, b in zip(val, base_val))
            check(worst_val <= TOL, f"{name}: val losses match (worst {worst_val:.1e})")
            worst_p, where, whole = compare_params(params, base_params, n_embd=32)
            check(worst_p <= TOL and whole <= TOL,
                  f"{name}: final parameters match (worst tensor {worst_p:.1e} in {where}, "
                  f"all parameters {whole:.1e})")

# Bad layouts fail before any work, on every rank, with one clear message.
_, err = mpirun(2, common + ["--dp", 3, "--out", fresh_dir("bad")], expect=2)
check("does not match the world size 2" in err, "dp that does not fit the world is refused")
