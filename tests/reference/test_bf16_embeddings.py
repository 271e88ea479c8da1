#!/usr/bin/env python3
"""bf16_embeddings (run by ctest; plain script): a bf16 model whose lookups read its embedding
tables rounded to bf16 (round to nearest even, the weight copies' rounding) is, exactly, the
bf16 model without the key on the same checkpoint with those tables rounded in the file.

Why exact: rounding a bf16-representable value gives it back, so the GEMMs that read a table
(a tied head) see the same bits either way, and backward never reads a table (it scatters the
output gradient). So, per family, on checkpoint C and C' = C with its tables rounded to bf16
(torch's nearest-even conversion, written into the shard in place):
  1. `trellis grad --precision bf16 --bf16-embeddings true` on C equals `trellis grad --precision
     bf16` on C': the loss and every gradient, bit for bit;
  2. it differs from `trellis grad --precision bf16` on C (the key acts: some gradient moves);
  3. a checkpoint trained with the key (`train --bf16-embeddings true`, 0 steps) records it in
     its config.json, and `trellis grad --precision bf16` on it, without the flag, equals 1
     (eval, sample, classify and translate read the checkpoint's config the same way), and
     `--bf16-embeddings false` on it equals the plain bf16 run on C (the flag turns it off);
  4. in fp32 the key changes nothing: `grad --precision fp32 --bf16-embeddings true` on C equals
     `grad --precision fp32` on C.
Families: GPT-2 (tied head, learned positions), LLaMA (untied head, RoPE: the token table
alone), the encoder-decoder (the decoder's own position table, a tied head) and an encoder
classifier with subword n-grams (the n-gram table, on GPT-2 tokens)."""
import json
import os
import shutil
import struct
import subprocess
import sys
import time

import numpy as np

if os.environ.get("TRELLIS_SOURCE"):
    sys.path.insert(0, os.path.join(os.environ["TRELLIS_SOURCE"], "tests"))

import torch  # noqa: E402

from reference import test_torch_oracle as oracle  # noqa: E402
from reference.test_torch_oracle import GPT2, LLAMA, fail  # noqa: E402
from reference.test_torch_oracle_encdec import ENCDEC  # noqa: E402
from reference.test_torch_oracle_subword import ENC_NGRAM, write_tsv  # noqa: E402
from reference.torch_ref import load_safetensors  # noqa: E402

T, B = 32, 4


def train_init(name, fam, data, extra=()):
    out = os.path.join(oracle.TMP, name)
    oracle.run(["train", *fam.args, "--data", data, "--out", out, "--steps", "0", "--seed", 11,
                "--quiet=true", "--tensorboard=false", "--val-every", "0", "--threads",
                oracle.THREADS, "--precision", "fp32", *extra])
    return os.path.join(out, "step_00000000")


def round_tables(src, dst, tables):
    """dst: a copy of the one-rank checkpoint src with `tables` rounded to bf16 in place (the
    file keeps its size, so its index stays valid). Returns how many values rounding changed."""
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    with open(os.path.join(dst, "index.json")) as f:
        index = json.load(f)
    changed = 0
    for name in tables:
        (piece,) = index["tensors"][name]["pieces"]
        path = os.path.join(dst, piece["file"])
        with open(path, "rb") as f:
            (hlen,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(hlen))
        start = 8 + hlen + header["params"]["data_offsets"][0] + 4 * piece["at"]
        n = piece["end"] - piece["begin"]
        values = np.memmap(path, dtype="<f4", mode="r+", offset=start, shape=(n,))
        rounded = torch.from_numpy(np.array(values)).to(torch.bfloat16).to(torch.float32).numpy()
        changed += int((rounded != values).sum())
        values[:] = rounded
        values.flush()
        del values
    return changed


def grad(name, ckpt, data, precision, extra=()):
    """`trellis grad` on a token shard's first B windows of T, or a task's first B examples."""
    path = os.path.join(oracle.TMP, f"{name}.safetensors")
    batch = ["--batch-size", B] if os.path.isdir(data) else ["--seq-len", T, "--batch-size", B]
    out = oracle.run(["grad", "--checkpoint", ckpt, "--data", data, *batch, "--threads",
                      oracle.THREADS, "--precision", precision, "--out", path, *extra])
    return json.loads(out.strip().splitlines()[-1])["loss"], load_safetensors(path)


def bitwise(a, b):
    """Names of the tensors (and "loss") where the two grad results differ in any bit."""
    (la, ga), (lb, gb) = a, b
    bad = [] if la == lb else ["loss"]
    if sorted(ga) != sorted(gb):
        return bad + ["<tensor names>"]
    return bad + [k for k in sorted(ga) if ga[k].tobytes() != gb[k].tobytes()]


def check_family(case, fam, data_dir, tables, data=None):
    """data: what grad reads (default: data_dir's first training shard)."""
    data = data or os.path.join(data_dir, "train_000000.bin")
    c = train_init(f"{case}_C", fam, data_dir)
    with open(os.path.join(c, "index.json")) as f:
        names = set(json.load(f)["tensors"])
    missing = [t for t in tables if t not in names]
    if missing:
        fail(f"{case}: the checkpoint has no {missing} (tensors: {sorted(names)})")
        return
    c_rounded = os.path.join(oracle.TMP, f"{case}_C_rounded")
    changed = round_tables(c, c_rounded, tables)
    if changed == 0:
        fail(f"{case}: rounding the tables changed nothing (they were bf16 already)")
        return
    keyed = grad(f"{case}_key", c, data, "bf16", ["--bf16-embeddings", "true"])
    on_rounded = grad(f"{case}_rounded", c_rounded, data, "bf16")
    plain = grad(f"{case}_plain", c, data, "bf16")
    ok = True

    bad = bitwise(keyed, on_rounded)
    if bad:
        ok = False
        fail(f"{case}: with the key on C differs from without it on C' in {bad[:6]}")
    moved = [k for k in sorted(plain[1]) if plain[1][k].tobytes() != keyed[1][k].tobytes()]
    if not moved:
        ok = False
        fail(f"{case}: the key changed no gradient (loss {keyed[0]} vs {plain[0]})")
    worst = max(float(np.abs(keyed[1][k].astype(np.float64) - plain[1][k]).max())
                for k in moved) if moved else 0.0

    # 3: the key from training's config, through the checkpoint
    trained = train_init(f"{case}_C_key", fam, data_dir, ["--bf16-embeddings", "true"])
    with open(os.path.join(trained, "config.json")) as f:
        recorded = json.load(f)["trellis"].get("bf16_embeddings")
    if recorded is not True:
        ok = False
        fail(f"{case}: config.json's trellis.bf16_embeddings is {recorded!r}, not true")
    bad = bitwise(grad(f"{case}_from_config", trained, data, "bf16"), keyed)
    if bad:
        ok = False
        fail(f"{case}: the checkpoint trained with the key does not read its tables in bf16 "
             f"({bad[:6]} differ from --bf16-embeddings)")

    bad = bitwise(grad(f"{case}_key_off", trained, data, "bf16", ["--bf16-embeddings", "false"]),
                  plain)
    if bad:
        ok = False
        fail(f"{case}: --bf16-embeddings false on the checkpoint trained with the key differs "
             f"from the plain bf16 run in {bad[:6]}")

    # 4: fp32 ignores the key
    bad = bitwise(grad(f"{case}_fp32_key", c, data, "fp32", ["--bf16-embeddings", "true"]),
                  grad(f"{case}_fp32", c, data, "fp32"))
    if bad:
        ok = False
        fail(f"{case}: in fp32 the key changed {bad[:6]}")
    print(f"{'PASS' if ok else 'FAIL'} {case}: tables {tables} ({changed} values rounded): "
          f"the key on C is bitwise the plain bf16 run on C' (loss {keyed[0]:.7f}); without "
          f"the key on C {len(moved)} of {len(plain[1])} gradients differ (up to {worst:.1e}); "
          f"config.json carries it, false turns it off; fp32 unchanged", flush=True)


def main():
    src = oracle.setup("bf16_embeddings", fresh=True)
    if src is None:
        return 2
    t0 = time.time()
    text = os.path.join(oracle.TMP, "corpus.txt")
    oracle.corpus(text)
    data = os.path.join(oracle.TMP, "data")
    oracle.run(["prepare", "--input", text, "--out", data, "--tokenizer", "byte"])
    tsv, task = os.path.join(oracle.TMP, "texts.tsv"), os.path.join(oracle.TMP, "classify")
    write_tsv(tsv)
    oracle.run(["prepare", "--task", "classify", "--input", tsv, "--out", task, "--val-fraction",
                0.2, "--tokenizer", "gpt2", "--tokenizer-dir", os.path.join(src, "tests", "data",
                                                                            "gpt2")])
    cases = [
        ("gpt2", lambda: check_family("gpt2", GPT2, data, ["wte.weight", "wpe.weight"])),
        ("llama", lambda: check_family("llama", LLAMA, data, ["model.embed_tokens.weight"])),
        ("encdec", lambda: check_family("encdec", ENCDEC, data, [
            "model.shared.weight", "model.encoder.embed_positions.weight",
            "model.decoder.embed_positions.weight"])),
        ("ngrams", lambda: check_family("ngrams", ENC_NGRAM, task, [
            "embed_tokens.weight", "embed_positions.weight", "embed_ngrams.weight"], task)),
    ]
    return oracle.run_cases(cases, "bf16 embeddings", t0)


if __name__ == "__main__":
    sys.exit(main())
