"""SentencePiece runs end to end: a translation directory with one shared model (the data's
tokenizer.model, </s> as the special token), a short encoder-decoder run stopped and resumed
(bitwise the uninterrupted run), its checkpoints (step_N and best) and export carrying the data's
tokenizer.model, `translate`, `eval` and `tokenize` through the checkpoint's or the export's own
copy; a classifier and a language model (`sample`) on SentencePiece data; and the refusals, each
exit 2 with one line naming the file or input: not a model, a vocabulary other than the
checkpoint's, a resume on data encoded with another model, flags without --tokenizer
sentencepiece, a vocabulary too large for the text."""
import json
import os
import shutil

from trellis_test import (TMP, check, fresh_dir, run, stop_and_resume, write_classify_tsv,
                          write_text_corpus, write_translate_tsv)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def refused(args, *needles):
    _, err = run(args, expect=2)
    lines = err.strip().split("\n")
    check(len(lines) == 1 and all(n in lines[0] for n in needles),
          f"{args[0]} {' '.join(str(a) for a in args[1:4])}...: exit 2 naming {needles}: {lines[-1]}")


inputs = fresh_dir("inputs")
pairs = os.path.join(inputs, "pairs.tsv")
write_translate_tsv(pairs, n=200)
sp = ["--tokenizer", "sentencepiece", "--vocab-size", 300]
mt = os.path.join(TMP, "translate")
run(["prepare", "--task", "translate", "--input", pairs, "--out", mt, "--sp-type", "bpe"] + sp)
with open(os.path.join(mt, "meta.json")) as f:
    meta = json.load(f)
check(meta["tokenizer"] == "sentencepiece" and meta["special_token"] == 2 and
      meta["vocab_size"] == 300 and os.path.isfile(os.path.join(mt, "tokenizer.model")),
      "translate data: tokenizer.model beside meta.json, vocab 300 pieces, </s> (2) special")
sources = os.path.join(inputs, "sources.txt")
with open(pairs) as f, open(sources, "w") as out:
    out.write("".join(line.split("\t")[0] + "\n" for line in f.readlines()[:12]))
ids, _ = run(["tokenize", "--data", mt, "--input", sources])
ids_file = os.path.join(inputs, "sources.ids")
with open(ids_file, "w") as f:
    f.write(ids)
back, _ = run(["tokenize", "--data", mt, "--decode", "--input", ids_file])
check(back == read(sources).decode(), "tokenize --decode gives the sources back")

train = ["train", "--data", mt, "--model", "encdec-tiny", "--steps", 6, "--batch-size", 8,
         "--lr", 3e-3, "--val-every", 3, "--keep-best", "val_loss", "--threads", 1, "--quiet",
         "--tensorboard", "false"]
full, split = stop_and_resume(train, 3, 6, "translate")
model = read(os.path.join(mt, "tokenizer.model"))
for ck in (os.path.join(full, "step_00000006"), os.path.join(full, "best"),
           os.path.join(split, "step_00000003"), os.path.join(split, "step_00000006")):
    check(read(os.path.join(ck, "tokenizer.model")) == model,
          f"{os.path.relpath(ck, TMP)} holds the data's tokenizer.model")
ck = os.path.join(full, "step_00000006")
with open(os.path.join(ck, "config.json")) as f:
    trellis = json.load(f)["trellis"]
check(trellis["tokenizer"] == "sentencepiece" and trellis["tokenizer_vocab"] == 300 and
      trellis["tokenizer_dir"] == "", "config.json: sentencepiece, 300 pieces, no path to the data")
hf = fresh_dir("hf")
run(["export", "--checkpoint", ck, "--out", hf])
check(read(os.path.join(hf, "tokenizer.model")) == model, "the export carries tokenizer.model")

# The data directory can go: the checkpoint and the export hold their tokenizer.
moved = mt + "_moved"
shutil.rmtree(moved, ignore_errors=True)
os.rename(mt, moved)
for owner in (ck, hf):
    got, _ = run(["tokenize", "--checkpoint", owner, "--input", sources])
    check(got == ids, f"tokenize --checkpoint {os.path.basename(owner)}: the data's ids")
    out, _ = run(["translate", "--checkpoint", owner, "--input", sources, "--max-len", 8])
    check(len(out.split("\n")) == 13, f"translate through {os.path.basename(owner)}: a line each")
os.rename(moved, mt)
metrics = json.loads(run(["eval", "--checkpoint", ck, "--data", mt, "--max-len", 8])[0])
check({"bleu", "chrf", "loss"} <= set(metrics), f"eval on the SentencePiece data: {metrics}")

# Refusals.
other = os.path.join(TMP, "translate_unigram")
run(["prepare", "--task", "translate", "--input", pairs, "--out", other, "--sp-type", "unigram"]
    + sp)
check(read(os.path.join(other, "tokenizer.model")) != model, "a unigram model of the same size")
refused(train + ["--data", other, "--out", split, "--resume", "--steps", 8],
        "step_00000006/tokenizer.model", "not encoded with this SentencePiece model")
smaller = os.path.join(TMP, "translate_small")
run(["prepare", "--task", "translate", "--input", pairs, "--out", smaller, "--sp-type", "bpe",
     "--tokenizer", "sentencepiece", "--vocab-size", 290])
bad = fresh_dir("bad_ck")
shutil.rmtree(bad)
shutil.copytree(ck, bad)
shutil.copy(os.path.join(smaller, "tokenizer.model"), os.path.join(bad, "tokenizer.model"))
refused(["translate", "--checkpoint", bad, "--input", sources], "bad_ck/tokenizer.model", "290")
refused(["tokenize", "--checkpoint", bad, "--input", sources], "bad_ck/tokenizer.model", "300")
with open(os.path.join(bad, "tokenizer.model"), "wb") as f:
    f.write(b"not a model at all")
refused(["sample", "--checkpoint", bad], "bad_ck/tokenizer.model", "not a SentencePiece model")
refused(["prepare", "--input", pairs, "--out", os.path.join(TMP, "x"), "--tokenizer-model",
         os.path.join(bad, "tokenizer.model")], "bad_ck/tokenizer.model", "not a SentencePiece")
refused(["prepare", "--input", pairs, "--out", os.path.join(TMP, "x"), "--sp-type", "bpe"],
        "--sp-type", "--tokenizer sentencepiece")
refused(["prepare", "--input", pairs, "--out", os.path.join(TMP, "x"), "--tokenizer", "gpt2",
         "--tokenizer-model", os.path.join(mt, "tokenizer.model")], "--tokenizer-model")
refused(["prepare", "--input", pairs, "--out", os.path.join(TMP, "x"), "--tokenizer",
         "sentencepiece", "--vocab-size", 0], "--vocab-size 0")
refused(["prepare", "--task", "translate", "--input", pairs, "--out", os.path.join(TMP, "x"),
         "--tokenizer", "sentencepiece", "--vocab-size", 100000], pairs, "Vocabulary size too high")
check(not os.path.exists(os.path.join(TMP, "x")), "refused prepares leave no directory")

# A classifier and a language model on SentencePiece data.
texts = os.path.join(inputs, "texts.tsv")
write_classify_tsv(texts, n=120)
cls = os.path.join(TMP, "classify")
run(["prepare", "--task", "classify", "--input", texts, "--out", cls, "--tokenizer",
     "sentencepiece", "--vocab-size", 320, "--sp-type", "bpe"])
out = fresh_dir("classify_run")
run(["train", "--data", cls, "--model", "encoder-tiny", "--steps", 3, "--batch-size", 8,
     "--threads", 1, "--quiet", "--tensorboard", "false", "--out", out])
lines = os.path.join(inputs, "lines.txt")
with open(lines, "w") as f:
    f.write("a bright warm day\nsad cold story\n")
got, _ = run(["classify", "--checkpoint", os.path.join(out, "step_00000003"), "--input", lines])
check(len(got.strip().split("\n")) == 2, "classify through the checkpoint's tokenizer.model")

corpus = fresh_dir("corpus")
write_text_corpus(os.path.join(corpus, "text.txt"))
lm = os.path.join(TMP, "lm")
run(["prepare", "--input", corpus, "--out", lm, "--tokenizer", "sentencepiece", "--vocab-size",
     300])
out = fresh_dir("lm_run")
run(["train", "--data", lm, "--model", "tiny", "--steps", 3, "--batch-size", 4, "--seq-len", 16,
     "--threads", 1, "--quiet", "--tensorboard", "false", "--out", out])
ck = os.path.join(out, "step_00000003")
check(read(os.path.join(ck, "tokenizer.model")) == read(os.path.join(lm, "tokenizer.model")),
      "a language model's checkpoint holds tokenizer.model too")
text, _ = run(["sample", "--checkpoint", ck, "--prompt", "the model", "--tokens", 12,
               "--temperature", 0])
check(text.startswith("the model") and len(text) > len("the model\n"),
      f"sample decodes through it: {text.strip()!r}")
