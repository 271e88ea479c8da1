"""The label_smoothing key: listed by --help and --dump-config, read from TOML, --set and the
flag; values outside [0, 1) exit 2 with one line naming the key (train and grad). 0 is exactly
the loss without the key. The training loss is the smoothed one, validation the plain negative
log-likelihood: after a step at learning rate 0 (parameters unchanged) a smoothed and a plain run
log different training losses and the same validation loss.

(The values themselves are checked against PyTorch in
reference/test_torch_oracle_smoothing.py, and under tensor parallelism in
parallel/test_tp_equivalence.py.)"""
import json
import os

from trellis_test import TMP, check, expect_error, fresh_dir, metrics, run, write_text_corpus


corpus = fresh_dir("corpus")
write_text_corpus(os.path.join(corpus, "text.txt"))
data = os.path.join(TMP, "data")
run(["prepare", "--input", corpus, "--out", data])
train = ["train", "--model", "tiny", "--n-layer", 1, "--n-embd", 32, "--batch-size", 4,
         "--seq-len", 16, "--quiet", "--tensorboard", "false", "--threads", 1, "--data", data]

# Listed and settable.
help_text, _ = run(["train", "--help"])
check("--label-smoothing" in help_text, "train --help lists --label-smoothing")
dump, _ = run(["train", "--dump-config"])
check("\nlabel_smoothing = 0   #" in dump, "--dump-config shows label_smoothing = 0 by default")
toml = os.path.join(TMP, "smooth.toml")
with open(toml, "w") as f:
    f.write("label_smoothing = 0.1\n")
dump, _ = run(["train", "--dump-config", "--config", toml])
check("\nlabel_smoothing = 0.1   #" in dump, "TOML label_smoothing = 0.1 is read")
dump, _ = run(["train", "--dump-config", "--set", "label_smoothing=0.25"])
check("\nlabel_smoothing = 0.25   #" in dump, "--set label_smoothing=0.25 is read")

# Out of range: exit 2, one line naming the key, from the flag, --set and TOML.
for bad in ("1", "1.5", "-0.1", "nan"):
    expect_error(train + ["--label-smoothing", bad, "--out", fresh_dir("bad")],
                 "label_smoothing", "[0, 1)")
expect_error(train + ["--set", "label_smoothing=2", "--out", fresh_dir("bad")], "label_smoothing")
with open(toml, "w") as f:
    f.write("label_smoothing = 1.0\n")
expect_error(train + ["--config", toml, "--out", fresh_dir("bad")], "label_smoothing")
expect_error(train + ["--label-smoothing", "x", "--out", fresh_dir("bad")], "label_smoothing")

# One step at learning rate 0: the parameters stay as initialised, so the validation losses of
# a smoothed and a plain run must be equal (plain NLL) while their training losses differ.
one = train + ["--steps", 1, "--lr", 0, "--min-lr", 0, "--warmup-steps", 0, "--val-every", 1,
               "--val-batches", 2, "--seed", 3]
results = {}
for name, extra in (("default", []), ("zero", ["--label-smoothing", 0]),
                    ("smooth", ["--label-smoothing", 0.3])):
    out = fresh_dir(name)
    run(one + extra + ["--out", out])
    steps, val = metrics(out)
    results[name] = (steps[0]["loss"], val[-1]["val_loss"], out)
check(results["zero"][:2] == results["default"][:2],
      f"label_smoothing 0 is the loss without the key, exactly ({results['zero'][:2]})")
d_train = abs(results["smooth"][0] - results["default"][0]) / results["default"][0]
check(d_train > 1e-4, f"the smoothed training loss differs from the plain one ({d_train:.1e})")
check(results["smooth"][1] == results["default"][1],
      f"validation reports the plain NLL under smoothing ({results['smooth'][1]} vs "
      f"{results['default'][1]})")

# grad: the same range.
ckpt = os.path.join(results["smooth"][2], "step_00000001")
shard = os.path.join(data, "train_000000.bin")
for bad in ("1", "-0.5"):
    expect_error(["grad", "--checkpoint", ckpt, "--data", shard, "--seq-len", 16, "--out",
                  os.path.join(TMP, "g.safetensors"), "--label-smoothing", bad],
                 "label-smoothing", "[0, 1)")
plain, _ = run(["grad", "--checkpoint", ckpt, "--data", shard, "--seq-len", 16, "--out",
                os.path.join(TMP, "g.safetensors")])
smooth, _ = run(["grad", "--checkpoint", ckpt, "--data", shard, "--seq-len", 16, "--out",
                 os.path.join(TMP, "g.safetensors"), "--label-smoothing", 0.3])
check(json.loads(plain)["loss"] != json.loads(smooth)["loss"],
      "grad --label-smoothing changes the loss")
