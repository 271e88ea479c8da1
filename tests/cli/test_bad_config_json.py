"""Malformed checkpoint files: a config.json whose sizes are absurd (n_embd = 1e9), negative, of
the wrong type or whose product is too large, and a state.json with a bad step, are refused before
anything is allocated: exit code 2 and one line naming the file and the key (not "cannot create
std::vector larger than max_size()" and exit 1)."""
import json
import os
import shutil

from trellis_test import TMP, check, expect_error, fresh_dir, run, write_text_corpus


corpus = fresh_dir("corpus")
write_text_corpus(os.path.join(corpus, "text.txt"))
data = os.path.join(TMP, "data")
run(["prepare", "--input", corpus, "--out", data])
shard = os.path.join(data, "val_000000.bin")
common = ["--steps", 2, "--batch-size", 2, "--seq-len", 16, "--quiet", "--threads", 1,
          "--data", data, "--tensorboard=false"]
ok = fresh_dir("ok")
run(["train", "--model", "tiny"] + common + ["--out", ok])
good = os.path.join(ok, "step_00000002")
with open(os.path.join(good, "config.json")) as f:
    good_cfg = json.load(f)


def broken_checkpoint(name, edit, file="config.json"):
    """A copy of the good checkpoint with `edit` applied to the JSON of `file`."""
    d = os.path.join(fresh_dir(name), "step_00000002")
    shutil.copytree(good, d)
    path = os.path.join(d, file)
    with open(path) as f:
        j = json.load(f)
    edit(j)
    with open(path, "w") as f:
        json.dump(j, f)
    return d


def setter(key, value):
    def edit(j):
        if "." in key:
            outer, inner = key.split(".", 1)
            j[outer][inner] = value
        else:
            j[key] = value
    return edit


# Each bad value, through every command that reads a checkpoint's config.json: eval, and
# train --init-from (a Hugging Face directory).
cases = [
    ("n_embd", 1000000000, "between 1 and"),     # the 1e9, as an integer
    ("n_embd", 1e9, "must be an integer"),        # ... and as JSON's 1000000000.0
    ("n_embd", -64, "between 1 and"),
    ("n_layer", 2 ** 63 + 5, "between 1 and"),    # above int64: must not wrap
    ("n_layer", -(2 ** 40), "between 1 and"),     # below int: must not truncate to 0
    ("vocab_size", 2 ** 31, "between 1 and"),     # must not truncate to a negative int
    ("n_head", "2", "must be an integer"),
    ("n_positions", [64], "must be an integer"),
    ("n_inner", 2 ** 40, "between 0 and"),
    ("trellis.vocab_multiple", 0, "vocab_multiple"),
    ("trellis.vocab_multiple", 2 ** 62, "vocab_multiple"),
    ("trellis.bf16_embeddings", "yes", "wrong type"),
]
for i, (key, value, why) in enumerate(cases):
    ck = broken_checkpoint(f"c{i}", setter(key, value))
    cfg = os.path.join(ck, "config.json")
    line = expect_error(["eval", "--checkpoint", ck, "--data", shard, "--seq-len", 16,
                         "--batch-size", 2, "--batches", 1], cfg, key.split(".")[-1], why)
    check("max_size" not in line and "bad_alloc" not in line, f"trellis's own message: {line}")
    expect_error(["train", "--init-from", ck] + common + ["--out", fresh_dir(f"c{i}_out")], cfg,
                 key.split(".")[-1], why)


def huge_product(j):
    # Every size within its bound, the model still ~2^46 parameters.
    j.update({"n_embd": 2 ** 17, "n_layer": 4096, "n_head": 2})


ck = broken_checkpoint("product", huge_product)
expect_error(["eval", "--checkpoint", ck, "--data", shard], os.path.join(ck, "config.json"),
             "parameters (at most")
# Sizes that are plausible but larger than the weights on disk: refused before allocating.
ck = broken_checkpoint("bigger", setter("n_embd", 2 ** 14))
expect_error(["eval", "--checkpoint", ck, "--data", shard], "index.json", "cannot hold",
             os.path.join(ck, "config.json"))
expect_error(["train", "--init-from", ck] + common + ["--out", fresh_dir("bigger_out")], ck,
             "cannot hold", os.path.join(ck, "config.json"))
# trellis.blocks: a classifier's class count is range-checked too.
ck = broken_checkpoint("classes", lambda j: j["trellis"]["blocks"].update(num_classes=2 ** 40))
expect_error(["eval", "--checkpoint", ck, "--data", shard], "config.json", "num_classes")

# state.json: resuming needs a non-negative integer step.
for i, step in enumerate([-3, "2", 2 ** 64 - 1, None, 2.5]):
    d = broken_checkpoint(f"s{i}", setter("step", step), "state.json")
    expect_error(["train", "--model", "tiny"] + common + ["--steps", 4, "--out",
                                                          os.path.dirname(d), "--resume"],
                 os.path.join(d, "state.json"), "step")
d = broken_checkpoint("s_list", lambda j: j.clear(), "state.json")
with open(os.path.join(d, "state.json"), "w") as f:
    f.write("[1, 2]")
expect_error(["train", "--model", "tiny"] + common + ["--steps", 4, "--out", os.path.dirname(d),
                                                      "--resume"], "state.json", "not a JSON object")
print("ok")
