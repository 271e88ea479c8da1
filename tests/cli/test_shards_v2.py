"""32-bit shards and mapped data (issue 15): `prepare` with a vocabulary beyond 65,536 writes
version-2 (uint32) shards that train and evaluate; version-1 (llm.c) shards keep loading; a shard
whose header count disagrees with its size, a meta.json vocabulary its uint16 shards cannot hold,
and a token beyond the vocabulary deep inside a shard (past what start-up looks at) each stop the
run with one line naming the file, exit 2."""
import json
import os
import string
import struct

from trellis_test import (SOURCE, TMP, check, expect_error, fresh_dir, metrics, run, write_shard,
                          write_text_corpus)


def shard_info(path):
    with open(path, "rb") as f:
        h = struct.unpack("<256i", f.read(1024))
    return h[1], h[2], os.path.getsize(path)


# A GPT-2 tokenizer whose vocabulary is padded to 70,000 ids (GPT-2's 50,257 and made-up tokens
# that no merge produces), so prepare must store ids in 32 bits.
tok = fresh_dir("tok70k")
with open(os.path.join(SOURCE, "tests", "data", "gpt2", "encoder.json")) as f:
    enc = json.load(f)
letters = string.ascii_uppercase
n = len(enc)
i = 0
while n < 70000:
    key = "QQ" + "".join(letters[(i // 26 ** k) % 26] for k in range(4))
    i += 1
    if key not in enc:
        enc[key] = n
        n += 1
with open(os.path.join(tok, "encoder.json"), "w") as f:
    json.dump(enc, f)
with open(os.path.join(SOURCE, "tests", "data", "gpt2", "vocab.bpe")) as f, \
        open(os.path.join(tok, "vocab.bpe"), "w") as g:
    g.write(f.read())

corpus = fresh_dir("corpus")
write_text_corpus(os.path.join(corpus, "text.txt"))
wide = os.path.join(TMP, "wide")
run(["prepare", "--input", corpus, "--out", wide, "--tokenizer", "gpt2", "--tokenizer-dir", tok])
v, count, size = shard_info(os.path.join(wide, "train_000000.bin"))
check(v == 2 and size == 1024 + 4 * count, f"a 70,000-token vocabulary gives version-2 shards "
      f"({count} uint32 tokens)")
meta = json.load(open(os.path.join(wide, "meta.json")))
check(meta["vocab_size"] == 70000, "meta.json records the vocabulary")
narrow = os.path.join(TMP, "narrow")
run(["prepare", "--input", corpus, "--out", narrow, "--tokenizer", "gpt2", "--tokenizer-dir",
     os.path.join(SOURCE, "tests", "data", "gpt2")])
v1, count1, size1 = shard_info(os.path.join(narrow, "train_000000.bin"))
check(v1 == 1 and size1 == 1024 + 2 * count1 and count1 == count,
      "GPT-2's own vocabulary still gives llm.c's version-1 shards, with the same tokens")

train = ["train", "--model", "tiny", "--steps", 3, "--batch-size", 4, "--seq-len", 16,
         "--threads", 1, "--quiet", "--tensorboard=false", "--val-batches", 1,
         "--peak-gflops-per-core", 100]
out_w = fresh_dir("out_wide")
run(train + ["--data", wide, "--out", out_w])
rows, val = metrics(out_w)
check(len(rows) == 3 and len(val) == 1, "training on version-2 shards runs and validates")
cfg = json.load(open(os.path.join(out_w, "step_00000003", "config.json")))
check(cfg.get("vocab_size") == 70000, "the model takes the 70,000-token vocabulary")
out_n = fresh_dir("out_narrow")
run(train + ["--data", narrow, "--out", out_n])
# Same token ids, larger vocabulary: the first loss differs only through the softmax's size.
check(rows[0]["loss"] > metrics(out_n)[0][0]["loss"],
      "the same tokens over a larger vocabulary start from a higher loss")
out, _ = run(["eval", "--checkpoint", os.path.join(out_w, "step_00000003"), "--data",
              os.path.join(wide, "val_000000.bin"), "--seq-len", 16, "--batch-size", 2,
              "--batches", 1])
check(json.loads(out)["loss"] > 0, "eval reads a version-2 shard")

# Bad shards.
bad = fresh_dir("bad")
for name in ("train_000000.bin", "val_000000.bin", "meta.json"):
    with open(os.path.join(wide, name), "rb") as f, open(os.path.join(bad, name), "wb") as g:
        g.write(f.read())
p = os.path.join(bad, "train_000000.bin")
with open(p, "r+b") as f:
    f.seek(8)
    f.write(struct.pack("<i", count + 5))  # the header claims 5 more tokens than the file holds
expect_error(train + ["--data", bad, "--out", fresh_dir("o1")], p, f"header says {count + 5}")

# 70,000 ids in uint16 shards cannot be: refused by the vocabulary in meta.json.
for name in ("train_000000.bin", "val_000000.bin"):
    with open(os.path.join(narrow, name), "rb") as f, open(os.path.join(bad, name), "wb") as g:
        g.write(f.read())
expect_error(train + ["--data", bad, "--out", fresh_dir("o2")], "vocab_size 70000", "65536")

# A token beyond the vocabulary past the first 64K tokens that start-up checks: found where the
# window holding it is read, naming the shard.
deep = fresh_dir("deep")
N = 200_000
tokens = [(k * 7) % 250 for k in range(N)]
tokens[100_000:] = [300] * (N - 100_000)  # byte vocabulary (256), so 300 is out of range
write_shard(os.path.join(deep, "train_000000.bin"), tokens, version=2)
write_shard(os.path.join(deep, "val_000000.bin"), tokens[:1000], version=1)
with open(os.path.join(deep, "meta.json"), "w") as f:
    json.dump({"tokenizer": "byte", "vocab_size": 256}, f)
expect_error(["train", "--model", "tiny", "--steps", 20, "--batch-size", 64, "--seq-len", 16,
              "--threads", 1, "--quiet", "--tensorboard=false", "--val-every", 0,
              "--peak-gflops-per-core", 100, "--data", deep, "--out", fresh_dir("o3")],
             os.path.join(deep, "train_000000.bin"), "token 300", "outside the vocabulary")
