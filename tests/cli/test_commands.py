"""The other subcommands end to end: help, dump-config, eval, sample, plot, prepare with GPT-2."""
import json
import os
import xml.etree.ElementTree as ET

from trellis_test import (checkpoint_tensors, check, expect_error, fresh_dir, metrics, run,
                          write_text_corpus, SOURCE, TMP)

out, _ = run(["train", "--help"])
for flag in ["--model", "--data", "--out", "--steps", "--batch-size", "--micro-batch-size",
             "--seq-len", "--lr", "--seed", "--threads", "--config", "--set", "--resume",
             "--save-every", "--val-every", "--dp", "--zero", "--comm-timeout"]:
    check(flag in out, f"train --help documents {flag}")
dump, _ = run(["train", "--dump-config", "--set", "lr=0.01", "--steps", "7"])
check('lr = 0.01' in dump and 'steps = 7' in dump, "--dump-config shows --set and flag values")
cfg_file = os.path.join(fresh_dir("config"), "dumped.toml")
with open(cfg_file, "w") as f:
    f.write(dump)
again, _ = run(["train", "--dump-config", "--config", cfg_file])
check(again == dump, "a dumped config loads back to the same configuration")
# An empty value is the value (a config's augment switched off from the command line), not "true":
# only a bare boolean flag means true.
aug_file = os.path.join(fresh_dir("config_augment"), "augment.toml")
with open(aug_file, "w") as f:
    f.write('augment = "flip"\n')
flip, _ = run(["train", "--dump-config", "--config", aug_file])
cleared, _ = run(["train", "--dump-config", "--config", aug_file, "--augment", ""])
check('augment = "flip"' in flip and 'augment = ""' in cleared,
      "--augment '' clears the config's augment")
expect_error(["train", "--dump-config", "--lr", ""], "lr", what="--lr ''")

corpus = fresh_dir("corpus")
write_text_corpus(os.path.join(corpus, "text.txt"))
data = os.path.join(TMP, "data")
run(["prepare", "--input", corpus, "--out", data, "--tokenizer", "gpt2",
     "--tokenizer-dir", os.path.join(SOURCE, "tests", "data", "gpt2")])
with open(os.path.join(data, "meta.json")) as f:
    check(json.load(f)["vocab_size"] == 50257, "GPT-2 data records vocab 50257")

run_dir = fresh_dir("run")
out, _ = run(["train", "--model", "tiny", "--data", data, "--out", run_dir, "--steps", 30,
              "--batch-size", 4, "--seq-len", 32, "--lr", 1e-2, "--val-every", 10,
              "--threads", 2, "--log-every", 10])
check(out.count("\nstep ") >= 3 and "tok/s" in out and "MFU" in out and "ETA" in out,
      "progress lines carry loss, tok/s, MFU and ETA")
check("trellis: done" in out and "best val loss" in out, "the run ends with a summary line")
check("GFLOP/s/core (measured fp32 FMA peak)" in out,
      "MFU divides by the measured peak, and the summary says so")
train, val = metrics(run_dir)
# MFU = model FLOPs per second (6 x parameters + 12 x layers x width x seq_len per token) over
# peak x threads; with the peak set by hand it can be recomputed from the run's own numbers.
set_dir = fresh_dir("run_peak")
out2, _ = run(["train", "--model", "tiny", "--data", data, "--out", set_dir, "--steps", 3,
               "--batch-size", 4, "--seq-len", 32, "--threads", 2, "--val-every", 0,
               "--peak-gflops-per-core", 40])
check("of 40 GFLOP/s/core (peak_gflops_per_core)" in out2, "a peak set by the user is named")
n_params = sum(t.size for t in checkpoint_tensors(
    os.path.join(set_dir, "step_00000003")).values())
row = metrics(set_dir)[0][-1]
want = row["tokens_per_s"] * (6 * n_params + 12 * 2 * 32 * 32) / (40e9 * 2)
check(abs(row["mfu"] - want) <= 1e-9 * want, f"mfu is computed against that peak ({row['mfu']:.4f})")
check(len(train) == 30 and all(k in train[0] for k in
      ["step", "loss", "lr", "grad_norm", "tokens_per_s", "mfu"]), "metrics.jsonl fields per step")
check([v["step"] for v in val] == [10, 20, 30], "validation every 10 steps")
check(train[-1]["loss"] < train[0]["loss"] - 1.0, "loss falls while training")

ck = os.path.join(run_dir, "step_00000030")
with open(os.path.join(ck, "config.json")) as f:
    cfg = json.load(f)
check(cfg["model_type"] == "gpt2" and cfg["vocab_size"] == 50257 and cfg["n_layer"] == 2,
      "config.json is a Hugging Face GPT2Config")
shard = os.path.join(data, "val_000000.bin")
out, _ = run(["eval", "--checkpoint", ck, "--data", shard, "--seq-len", 32, "--batch-size", 2,
              "--batches", 3])
res = json.loads(out)
check(res["windows"] == 6 and abs(res["loss"] - val[-1]["val_loss"]) < 1.0,
      f"eval prints a JSON loss ({res['loss']:.4f}) near the run's val loss")

text, _ = run(["sample", "--checkpoint", ck, "--prompt", "the model", "--tokens", 20,
               "--seed", 3])
check(text.startswith("the model") and len(text) > len("the model") + 10,
      f"sample continues the prompt: {text.strip()[:60]!r}")
text2, _ = run(["sample", "--checkpoint", ck, "--prompt", "the model", "--tokens", 20,
                "--seed", 3])
check(text == text2, "sampling is reproducible with a seed")
greedy, _ = run(["sample", "--checkpoint", ck, "--prompt", "the", "--tokens", 5,
                 "--temperature", 0])
check(greedy.startswith("the"), "greedy sampling works")

svg = os.path.join(TMP, "loss.svg")
run(["plot", os.path.join(run_dir, "metrics.jsonl"), "-o", svg])
root = ET.parse(svg).getroot()
check(root.tag.endswith("svg") and len(root.findall(".//{http://www.w3.org/2000/svg}polyline")) >= 1,
      "plot writes a well-formed SVG with a loss line")
