"""Bad input: one line naming the problem on stderr, exit code 2, nothing half-written."""
import json
import os

from trellis_test import (SOURCE, TMP, check, expect_error, fresh_dir, run, shard_header,
                          write_text_corpus)


corpus = fresh_dir("corpus")
write_text_corpus(os.path.join(corpus, "text.txt"))
data = os.path.join(TMP, "data")
run(["prepare", "--input", corpus, "--out", data])
train = ["train", "--model", "tiny", "--steps", 2, "--batch-size", 2, "--seq-len", 16,
         "--quiet", "--threads", 1]

# Data files.
expect_error(train + ["--data", "/nonexistent/dir", "--out", fresh_dir("o1")], "/nonexistent/dir")
bad = fresh_dir("truncated")
with open(os.path.join(data, "train_000000.bin"), "rb") as f:
    blob = f.read()
with open(os.path.join(bad, "train_000000.bin"), "wb") as f:
    f.write(blob[:-3])
with open(os.path.join(data, "val_000000.bin"), "rb") as f, \
        open(os.path.join(bad, "val_000000.bin"), "wb") as g:
    g.write(f.read())
o2 = fresh_dir("o2")
expect_error(train + ["--data", bad, "--out", o2], "train_000000.bin", "truncated")
check(os.listdir(o2) == [], "nothing written after a bad shard")
with open(os.path.join(bad, "train_000000.bin"), "wb") as f:
    f.write(shard_header(1, 0, magic=12345))
expect_error(train + ["--data", bad, "--out", fresh_dir("o3")], "train_000000.bin", "magic")

# Configuration.
expect_error(train + ["--data", data, "--set", "no_such_key=3", "--out", fresh_dir("o4")],
             "no_such_key")
toml = os.path.join(TMP, "bad.toml")
with open(toml, "w") as f:
    f.write('model = "tiny"\nlearning_rate = 0.1\n')
expect_error(train + ["--data", data, "--config", toml, "--out", fresh_dir("o5")],
             "bad.toml", "learning_rate")
with open(toml, "w") as f:
    f.write('model = "tiny\n')
expect_error(train + ["--data", data, "--config", toml, "--out", fresh_dir("o5b")], "bad.toml")
expect_error(train + ["--data", data, "--steps", "ten", "--out", fresh_dir("o6")], "steps", "ten")
expect_error(train + ["--data", data, "--n-head", 5, "--out", fresh_dir("o7")], "n_head=5",
             "n_embd=32")
# Dropout probabilities outside [0, 1): flag, --set and TOML alike.
expect_error(train + ["--data", data, "--dropout", "1.0", "--out", fresh_dir("o7d")], "'dropout'",
             "[0, 1)")
expect_error(train + ["--data", data, "--set", "attn_dropout=-0.1", "--out", fresh_dir("o7e")],
             "'attn_dropout'")
with open(toml, "w") as f:
    f.write("classifier_dropout = nan\n")
expect_error(train + ["--data", data, "--config", toml, "--out", fresh_dir("o7f")],
             "'classifier_dropout'")
# Model families: shapes each family cannot take.
llama = ["train", "--model", "llama-tiny", "--steps", 1, "--batch-size", 2, "--seq-len", 16,
         "--quiet", "--threads", 1, "--data", data]
expect_error(llama + ["--n-kv-head", 3, "--out", fresh_dir("o7b")], "n_kv_head=3",
             "does not divide n_head=4")
expect_error(train + ["--data", data, "--n-kv-head", 1, "--out", fresh_dir("o7c")], "gpt2",
             "grouped-query")
expect_error(train + ["--data", data, "--n-dec-layer", 2, "--out", fresh_dir("o7d")],
             "n_dec_layer=2")
expect_error(train + ["--data", data, "--model", "llama-huge", "--out", fresh_dir("o7e")],
             "llama-huge", "llama-baby")
expect_error(train + ["--data", data, "--seq-len", 100, "--out", fresh_dir("o8")], "seq_len 100",
             "64")
expect_error(train + ["--data", data, "--batch-size", 4, "--micro-batch-size", 3,
                      "--out", fresh_dir("o9")], "micro_batch_size 3")
expect_error(train + ["--data", data, "--model", "gpt5", "--out", fresh_dir("o10")], "gpt5")
expect_error(train + ["--data", data, "--tp", 2, "--out", fresh_dir("o11")], "world size")

# Checkpoints.
ok = fresh_dir("ok")
run(train + ["--data", data, "--out", ok])
ck = os.path.join(ok, "step_00000002")
shard = os.path.join(data, "val_000000.bin")
evalcmd = ["eval", "--checkpoint", ck, "--data", shard, "--seq-len", 16, "--batch-size", 2,
           "--batches", 1]
run(evalcmd)
model = os.path.join(ck, "shard_00000.safetensors")
with open(model, "rb") as f:
    blob = f.read()
with open(model, "wb") as f:
    f.write(blob[: len(blob) // 2])
expect_error(evalcmd, model)
with open(model, "wb") as f:
    f.write(b"\xff" * 8 + blob[8:])
expect_error(evalcmd, model)
os.remove(model)
expect_error(evalcmd, model)
with open(os.path.join(ck, "config.json"), "w") as f:
    f.write('{"n_layer": 2')
expect_error(evalcmd, "config.json")
expect_error(["eval", "--checkpoint", os.path.join(ok, "missing"), "--data", shard], "missing")
check(not any(n.startswith(".") for n in os.listdir(ok)), "no temporary checkpoint left behind")

# Tokenizer files.
expect_error(["prepare", "--input", corpus, "--out", fresh_dir("p1"), "--tokenizer", "gpt2",
              "--tokenizer-dir", "/nonexistent/gpt2"], "/nonexistent/gpt2")
broken = fresh_dir("broken_tok")
with open(os.path.join(broken, "encoder.json"), "w") as f:
    f.write("{not json")
with open(os.path.join(broken, "vocab.bpe"), "w") as f:
    f.write("#version: 0.2\n")
expect_error(["prepare", "--input", corpus, "--out", fresh_dir("p2"), "--tokenizer", "gpt2",
              "--tokenizer-dir", broken], "encoder.json")
# A model vocabulary larger than the GPT-2 tokenizer's (a task directory whose meta.json claims
# more ids) cannot have subword n-grams: there are no bytes to cut for the ids beyond it.
wide = fresh_dir("wide_vocab")
with open(os.path.join(wide, "labels.tsv"), "w") as f:
    f.write("sentence\tlabel\n" + "".join(f"text {i}\t{i % 2}\n" for i in range(8)))
run(["prepare", "--task", "classify", "--input", os.path.join(wide, "labels.tsv"),
     "--out", os.path.join(wide, "data"), "--val-fraction", 0.25])
with open(os.path.join(wide, "data", "meta.json")) as f:
    meta = json.load(f)
meta.update(tokenizer="gpt2", vocab_size=50300,
            tokenizer_dir=os.path.join(SOURCE, "tests", "data", "gpt2"))
with open(os.path.join(wide, "data", "meta.json"), "w") as f:
    json.dump(meta, f)
expect_error(["train", "--model", "encoder-tiny", "--steps", 1, "--batch-size", 2, "--quiet",
              "--threads", 1, "--data", os.path.join(wide, "data"), "--subword-ngrams", 64,
              "--out", fresh_dir("o_sw")],
             "subword_ngrams", "vocabulary (50300)", "tokenizer's (50257)")

# A checkpoint of another model is refused on resume, naming the differing config.json key (a
# tied head would otherwise leave lm_head at zero), and config.json values trellis cannot
# represent are refused naming the file and key.
ck_out = fresh_dir("o_llama_ck")
run(llama + ["--out", ck_out, "--tensorboard=false"])
ck_cfg = os.path.join(ck_out, "step_00000001", "config.json")
with open(ck_cfg) as f:
    text = f.read()
with open(ck_cfg, "w") as f:
    f.write(text.replace('"tie_word_embeddings": false', '"tie_word_embeddings": true'))
expect_error(llama + ["--out", ck_out, "--steps", 2, "--resume"], "tie_word_embeddings",
             "step_00000001")
with open(ck_cfg, "w") as f:
    f.write(text.replace('"hidden_act": "silu"', '"hidden_act": "gelu"'))
expect_error(["sample", "--checkpoint", os.path.join(ck_out, "step_00000001"), "--prompt", "a"],
             "config.json", "hidden_act")
expect_error(llama + ["--n-kv-head", -2, "--out", fresh_dir("o_kv")], "n_kv_head must be >= 0",
             "-2")
expect_error(llama + ["--norm", "batchnorm", "--out", fresh_dir("o_norm")], "norm", "rmsnorm",
             "batchnorm")
