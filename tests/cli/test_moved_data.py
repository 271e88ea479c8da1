"""A prepared data directory moved together with its GPT-2 tokenizer still works: meta.json
records a tokenizer directory that lies in or beside the data directory relative to it, and reads
it relative to the data directory (src/trellis/data/tokenizer_dir.h); a tokenizer elsewhere is
recorded absolute, as earlier versions recorded every one, and still reads. Checked for a token
corpus and a task directory: tokenize --data, one training step with validation, and sample /
classify from the checkpoint (which loads the tokenizer the data named)."""
import json
import os
import shutil

from trellis_test import SOURCE, TMP, check, fresh_dir, metrics, run, write_text_corpus

GPT2 = os.path.join(SOURCE, "tests", "data", "gpt2")
HELLO = [15496, 995]  # "Hello world", GPT-2's known encoding


def recorded(data):
    with open(os.path.join(data, "meta.json")) as f:
        return json.load(f)["tokenizer_dir"]


inputs = fresh_dir("inputs")
hello = os.path.join(inputs, "hello.txt")
with open(hello, "w") as f:
    f.write("Hello world\n")


def tokens(data):
    out, _ = run(["tokenize", "--data", data, "--input", hello])
    return json.loads(out)


site = fresh_dir("site")
moved = os.path.join(TMP, "moved")
shutil.rmtree(moved, ignore_errors=True)
tok = os.path.join(site, "gpt2")
shutil.copytree(GPT2, tok)
text = os.path.join(inputs, "text.txt")
write_text_corpus(text, 100)
tsv = os.path.join(inputs, "colours.tsv")
with open(tsv, "w") as f:
    f.write("sentence\tlabel\n" + "".join(f"the {c} one number {i}\t{c}\n"
                                          for i in range(12) for c in ("red", "blue")))
gpt2 = ["--tokenizer", "gpt2", "--tokenizer-dir"]
run(["prepare", "--input", text, "--out", os.path.join(site, "lm"), *gpt2, tok])
run(["prepare", "--task", "classify", "--input", tsv, "--out", os.path.join(site, "cls"),
     "--val-fraction", 0.25, *gpt2, tok + "/"])
far = fresh_dir("far")
run(["prepare", "--input", text, "--out", far, *gpt2, GPT2])
check(recorded(os.path.join(site, "lm")) == "../gpt2" and
      recorded(os.path.join(site, "cls")) == "../gpt2",
      "a tokenizer beside the data directory is recorded relative to it")
check(recorded(far) == os.path.normpath(os.path.abspath(GPT2)),
      "a tokenizer elsewhere is recorded absolute")

os.rename(site, moved)
lm, cls = os.path.join(moved, "lm"), os.path.join(moved, "cls")
check(tokens(lm) == HELLO and tokens(cls) == HELLO,
      "after the move, both data directories find their tokenizer")
check(tokens(far) == HELLO, "an absolute tokenizer_dir still reads")

steps = ["--steps", 1, "--batch-size", 2, "--threads", 1, "--quiet", "--tensorboard=false",
         "--val-every", 1]
lm_run = fresh_dir("lm_run")
run(["train", "--data", lm, "--model", "tiny", "--seq-len", 16, "--val-batches", 1,
     "--out", lm_run, *steps])
check(len(metrics(lm_run)[1]) == 1, "the moved corpus trains and validates one step")
sampled, _ = run(["sample", "--checkpoint", os.path.join(lm_run, "step_00000001"),
                  "--prompt", "Hello", "--tokens", 3])
check(sampled.startswith("Hello"), f"sample decodes with the moved tokenizer: {sampled!r}")

cls_run = fresh_dir("cls_run")
run(["train", "--data", cls, "--model", "encoder-tiny", "--out", cls_run, *steps])
out, _ = run(["classify", "--checkpoint", os.path.join(cls_run, "step_00000001"),
              "--input", hello])
check(json.loads(out)["label"] in ("red", "blue"),
      "the moved task directory trains one step and its checkpoint classifies")
