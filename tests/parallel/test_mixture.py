"""Dataset mixtures (issue 15): `--data A:0.7,B:0.3` draws training windows from two prepared
directories by weight. B's shards are rewritten as version-2 (uint32) shards, so 32-bit shards are
covered too.

- A one-dataset mixture (`A:1`, and `A:1,B:0` where B gets no slot) trains exactly the plain
  `--data A` run (bitwise losses): mixing changes nothing until there is something to mix; a real
  mixture trains on other windows than A alone.
- Each dataset's validation loss is reported on its own (`val_loss/A`, `val_loss/B` in
  metrics.jsonl, `val/loss/A`, `val/loss/B` in TensorBoard), next to the overall `val_loss`.
- Layouts dp2, tp2 and pp2 (1F1B) of the mixture equal the 1-process run to 1e-5, and a stopped
  and resumed mixture run equals the uninterrupted one bit for bit (the mixture is a function of
  (seed, step, sequence) only).
- A negative weight, weights summing to zero, an entry without a weight and a missing directory
  each exit 2 with one line naming them."""
import os

from trellis_test import (TMP, LayoutCheck, check, expect_error, fresh_dir, metrics, read_shard,
                          run, stop_and_resume, write_shard, write_text_corpus)


def to_v2(path):
    """Rewrites a version-1 shard as version 2 (the same tokens as uint32)."""
    write_shard(path, read_shard(path), version=2)


a_in, b_in = fresh_dir("a_in"), fresh_dir("b_in")
write_text_corpus(os.path.join(a_in, "text.txt"), n_lines=600)
with open(os.path.join(b_in, "text.txt"), "w") as f:  # another text: digits and punctuation
    f.write("".join(f"{i * 7919 % 1000:03d}; {i % 17} + {i % 5} = {i % 17 + i % 5}!\n"
                    for i in range(1500)))
A, B = os.path.join(TMP, "A"), os.path.join(TMP, "B")
run(["prepare", "--input", a_in, "--out", A])
run(["prepare", "--input", b_in, "--out", B])
for name in os.listdir(B):
    if name.endswith(".bin"):
        to_v2(os.path.join(B, name))
mix = f"{A}:0.7,{B}:0.3"

base = ["train", "--model", "tiny", "--batch-size", 8, "--seq-len", 32, "--lr", 3e-3,
        "--warmup-steps", 3, "--threads", 1, "--quiet", "--peak-gflops-per-core", 100]


def losses(data, name, steps=6, extra=()):
    out = fresh_dir(name)
    run(base + ["--data", data, "--steps", steps, "--val-every", 3, "--out", out] + list(extra))
    return out, metrics(out)


plain_out, (plain, _) = losses(A, "plain")
_, (one, _) = losses(f"{A}:1", "one")
_, (zero_b, _) = losses(f"{A}:1,{B}:0", "zero_b")
check([r["loss"] for r in one] == [r["loss"] for r in plain],
      "A:1 trains exactly what --data A does")
check([r["loss"] for r in zero_b] == [r["loss"] for r in plain],
      "A:1,B:0 too (B gets no slot)")
mix_out, (mixed, mixed_val) = losses(mix, "mixed")
check([r["loss"] for r in mixed] != [r["loss"] for r in plain],
      "A:0.7,B:0.3 trains on other windows")

# Per-dataset validation.
check(all("val_loss/A" in v and "val_loss/B" in v for v in mixed_val),
      "metrics carry val_loss/A and val_loss/B")
v = mixed_val[-1]
check(v["val_loss/A"] != v["val_loss/B"] and
      min(v["val_loss/A"], v["val_loss/B"]) <= v["val_loss"] <= max(v["val_loss/A"],
                                                                     v["val_loss/B"]),
      f"the overall val loss lies between the datasets' ({v['val_loss/A']:.4f}, "
      f"{v['val_loss']:.4f}, {v['val_loss/B']:.4f})")
tb = os.path.join(mix_out, "tb")
events = b"".join(open(os.path.join(tb, n), "rb").read() for n in os.listdir(tb))
check(b"val/loss/A" in events and b"val/loss/B" in events,
      "TensorBoard gets val/loss/A and val/loss/B")
plain_val = metrics(plain_out)[1]
check(all(not any(k.startswith("val_loss/") for k in r) for r in plain_val),
      "an unmixed run reports its one val_loss only")

# Layouts and resume.
common = base + ["--data", mix, "--steps", 10, "--val-every", 5, "--tensorboard", "false"]
layouts = LayoutCheck(common, n_embd=32, steps=10)
layouts.check("mix_dp2", 2, ["--dp", 2])
layouts.check("mix_tp2", 2, ["--tp", 2])
layouts.check("mix_pp2", 2, ["--pp", 2, "--schedule", "1f1b", "--micro-batch-size", 2])

stop_and_resume(common, 5, 10, "mixture")

# Bad mixtures.
one_step = base + ["--steps", 1, "--out", fresh_dir("bad")]
expect_error(one_step + ["--data", f"{A}:0.7,{B}:-0.3"], B, "negative", "-0.3")
expect_error(one_step + ["--data", f"{A}:0,{B}:0"], "sum to 0")
expect_error(one_step + ["--data", f"{A}:0.7,{B}"], B, "no weight")
missing = os.path.join(TMP, "no_such_dataset")
expect_error(one_step + ["--data", f"{A}:0.7,{missing}:0.3"], missing, "not found")
