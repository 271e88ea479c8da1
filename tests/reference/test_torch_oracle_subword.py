#!/usr/bin/env python3
"""PyTorch oracle test of subword n-gram features (config key subword_ngrams; run by ctest;
plain script).

Environment as test_torch_oracle.py (TRELLIS_BIN, TRELLIS_TMP, TRELLIS_SOURCE). The reference is
reference/torch_encoder.py with reference/subword_ngrams.py, which computes each token's bag of
hashed character n-grams itself from GPT-2's encoder.json (not from anything trellis writes).

Data: short texts in three languages, with accented words (multi-byte UTF-8 characters, words
that GPT-2 cuts into several tokens), prepared with the GPT-2 tokenizer; padded batches.

Checks:
  a. encoder-tiny classifier, mean pooling, subword_ngrams = 97, n-grams of 2-4 characters: loss
     and every gradient of `trellis grad` (embed_ngrams.weight included) equal the reference's
     at 1e-5; and the comparison can fail: the n-grams change the reference's gradients of the
     other parameters by more than 100 * 1e-5 (the table zeroed), the batch's bags hold
     multi-byte characters and words of several tokens, and embed_ngrams.weight's gradient is
     not zero.
  b. bad input exits 2 naming the key: subword_ngrams on byte-tokenized data, and
     ngram_min > ngram_max.

Usage: test_torch_oracle_subword.py [a b]  (default: all cases)
"""

import os
import subprocess
import sys
import time

if os.environ.get("TRELLIS_SOURCE"):
    sys.path.insert(0, os.path.join(os.environ["TRELLIS_SOURCE"], "tests"))

import torch  # noqa: E402

from reference import subword_ngrams  # noqa: E402
from reference import test_torch_oracle as oracle  # noqa: E402
from reference import test_torch_oracle_tasks as tasks  # noqa: E402
from reference import torch_tasks  # noqa: E402
from reference.test_torch_oracle import fail  # noqa: E402
from reference.torch_ref import load_safetensors  # noqa: E402

NGRAMS = ["--subword-ngrams", 97, "--ngram-min", 2, "--ngram-max", 4]
ENC_NGRAM = tasks.task_family("encoder classifier with subword n-grams",
                              ["--model", "encoder-tiny", *NGRAMS], tasks._encoder_zero_grad)

_WORDS = {
    "de": ["Übersetzung", "größer", "schließen", "Einstellungen", "Datei", "öffnen", "für"],
    "es": ["configuración", "niño", "señal", "archivo", "abrir", "búsqueda", "también"],
    "fr": ["paramètres", "fenêtre", "être", "fichier", "ouvrir", "réseau", "déjà"],
}


def write_tsv(path, n=30):
    import random
    r = random.Random(5)
    labels = sorted(_WORDS)
    with open(path, "w") as f:
        f.write("sentence\tlabel\n")
        for i in range(n):
            label = labels[i % 3]
            words = [r.choice(_WORDS[label]) for _ in range(r.randint(1, 6))]
            f.write(" ".join(words) + f"\t{label}\n")


def check_bags_matter(task_dir, B):
    """The bags of the batch hold multi-byte characters and multi-token words, and the n-gram
    table changes the reference's other gradients (else the comparison could not see a trellis
    without n-grams). Returns that change."""
    out = os.path.join(oracle.TMP, "a_init", "step_00000000")
    params, cfg = torch_tasks.load_model(out, dtype=torch.float64)
    _, train, _ = torch_tasks.read_task(task_dir)
    batch = torch_tasks.make_batch(cfg, train, range(B))
    text = subword_ngrams.token_bytes()
    multi_token = multi_byte = 0
    for row in batch["tokens"].tolist():
        multi_token += sum(1 for a, b in zip(row, row[1:])
                           if text[a] and text[b] and not text[b].startswith(b" "))
        multi_byte += sum(1 for t in row if any(b >= 0x80 for b in text[t]))
    if not (multi_token and multi_byte):
        fail(f"a: the batch has {multi_token} word-continuing and {multi_byte} non-ASCII tokens; "
             f"the test needs both")

    def grads(zero_table):
        p = {n: t.detach().clone().requires_grad_(True) for n, t in params.items()}
        if zero_table:
            with torch.no_grad():
                p["embed_ngrams.weight"].zero_()
        torch_tasks.task_loss(p, cfg, batch).backward()
        return torch.cat([p[n].grad.flatten() for n in sorted(p) if n != "embed_ngrams.weight"])
    d = oracle.rel(grads(True).numpy(), grads(False).numpy())
    if not d > 100 * oracle.TOL:
        fail(f"a: the n-grams change the reference's other gradients by only {d:.1e}; the "
             f"comparison would not see a trellis without them")
    return d


def case_a(task_dir):
    B = 8
    tasks.check_task_grad("a", ENC_NGRAM, task_dir, B)  # writes TMP/a_init, TMP/a_grad.*
    grads = load_safetensors(os.path.join(oracle.TMP, "a_grad.safetensors"))
    g = grads.get("embed_ngrams.weight")
    if g is None or not float(abs(g).max()) > 0:
        fail("a: trellis's gradient of embed_ngrams.weight is missing or zero")
    d = check_bags_matter(task_dir, B)
    print(f"  a: without the n-gram table the other gradients differ by {d:.1e}", flush=True)


def refused(args, key):
    cmd = [oracle.BIN] + [str(a) for a in args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if p.returncode != 2 or key not in p.stderr or len(p.stderr.strip().splitlines()) != 1:
        fail(f"b: {' '.join(cmd)}: exit {p.returncode}, stderr {p.stderr!r}; expected exit 2 "
             f"and one line naming {key}")


def case_b(byte_dir, task_dir):
    common = ["train", "--model", "encoder-tiny", "--steps", 0, "--quiet=true",
              "--tensorboard=false", "--val-every", 0, "--out", os.path.join(oracle.TMP, "b")]
    refused([*common, "--data", byte_dir, "--subword-ngrams", 64], "subword_ngrams")
    refused([*common, "--data", task_dir, "--subword-ngrams", 64, "--ngram-min", 5,
             "--ngram-max", 3], "ngram_min")


def main():
    src = oracle.setup("torch_oracle_subword", fresh=True)
    if src is None:
        return 2
    t0 = time.time()
    tsv = os.path.join(oracle.TMP, "texts.tsv")
    write_tsv(tsv)
    task_dir, byte_dir = os.path.join(oracle.TMP, "classify"), os.path.join(oracle.TMP, "bytes")
    oracle.run(["prepare", "--task", "classify", "--input", tsv, "--out", task_dir,
                "--val-fraction", 0.2, "--tokenizer", "gpt2",
                "--tokenizer-dir", os.path.join(src, "tests", "data", "gpt2")])
    oracle.run(["prepare", "--task", "classify", "--input", tsv, "--out", byte_dir,
                "--val-fraction", 0.2])
    cases = [("a", lambda: case_a(task_dir)), ("b", lambda: case_b(byte_dir, task_dir))]
    return oracle.run_cases(cases, "torch oracle subword n-grams", t0)


if __name__ == "__main__":
    sys.exit(main())
