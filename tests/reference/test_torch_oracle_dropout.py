#!/usr/bin/env python3
"""PyTorch oracle of trellis's dropout (run by ctest; plain script).

Environment as test_torch_oracle.py (TRELLIS_BIN, TRELLIS_TMP, TRELLIS_SOURCE). The masks are
drawn here by reference/dropout_masks.py, Philox4x32-10 and trellis's mask formula written again
with numpy (never masks exported by trellis); the reference models apply them at the same
sites (embedding output, every residual branch, attention probabilities, a classifier's pooled
vector). `trellis grad --dropout P --attn-dropout P [--classifier-dropout P] --dropout-seed S
--dropout-step K` draws the masks of a training step K of a run seeded S on its batch.

Checks (every tensor norm-wise, ||trellis - torch|| / ||torch|| <= 1e-5):
  p. the Python Philox4x32-10 reproduces Random123's known-answer vectors, and a mask keeps
     about 1 - p of its elements at 1 / (1 - p);
  a. tiny GPT-2, byte tokenizer, batch 4 x 32: loss and every gradient with dropout 0.2 and
     attn_dropout 0.3;
  b. llama-tiny (GQA 4 heads over 2, RoPE, SwiGLU): as a;
  c. encoder-tiny classifier (mean pooling over padded examples), dropout 0.2, attn_dropout 0.3,
     classifier_dropout 0.5;
  d. encdec-tiny (encoder and decoder embeddings, self and cross attention): as a;
  e. encdec-tiny translating padded pairs (source padding masked in self and cross attention,
     padded targets): as a.
Each case also checks that the dropout matters: the reference without masks differs from
trellis's loss or gradients by more than 100 * TOL (a trellis that ignored the keys fails).

Usage: test_torch_oracle_dropout.py [p a b c d e]  (default: all)
"""

import json
import os
import sys
import time

import numpy as np

if os.environ.get("TRELLIS_SOURCE"):
    sys.path.insert(0, os.path.join(os.environ["TRELLIS_SOURCE"], "tests"))

import torch  # noqa: E402

from reference import dropout_masks as drop  # noqa: E402
from reference import test_torch_oracle as oracle  # noqa: E402
from reference import torch_tasks  # noqa: E402
from reference.test_torch_oracle import GPT2, LLAMA, compare_grads, fail  # noqa: E402
from reference.test_torch_oracle_encdec import ENCDEC  # noqa: E402
from reference.test_torch_oracle_tasks import ENC_MEAN, ENCDEC_MT  # noqa: E402
from reference.torch_ref import load_safetensors, read_tokens, windows  # noqa: E402
from trellis_test import write_classify_tsv, write_translate_tsv  # noqa: E402

SEED, STEP = 11, 7
P, P_ATTN, P_CLS = 0.2, 0.3, 0.5


def check_philox(case):
    # Random123's kat_vectors for philox4x32-10: (counter, key) -> output
    kat = [((0, 0, 0, 0), 0, (0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8)),
           ((0xffffffff,) * 4, 0xffffffffffffffff,
            (0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd)),
           ((0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), 0x299f31d0a4093822,
            (0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1))]
    ok = True
    for ctr, key, want in kat:
        got = tuple(int(w) for w in drop.philox4x32_10(ctr, key))
        if got != want:
            fail(f"{case}: philox4x32-10 {ctr} key {key:#x}: {[hex(w) for w in got]}")
            ok = False
    m = drop.multipliers(0.25, drop.dropout_key(1, 2, 3, drop.MLP_OUT), np.arange(1 << 16), 5, 6, 0)
    kept = float((m > 0).mean())
    if not (abs(kept - 0.75) < 0.01 and np.all((m == 0) | (m == np.float32(1) / np.float32(0.75)))):
        fail(f"{case}: a p = 0.25 mask keeps {kept:.4f} of its elements")
        ok = False
    print(f"{'PASS' if ok else 'FAIL'} {case}: Random123 known answers; p 0.25 keeps {kept:.4f}",
          flush=True)


def grad_args(p_cls=0.0):
    return ["--dropout", P, "--attn-dropout", P_ATTN, "--classifier-dropout", p_cls,
            "--dropout-seed", SEED, "--dropout-step", STEP]


def init(case, fam, data, extra=()):
    out = os.path.join(oracle.TMP, f"{case}_init")
    oracle.run(["train", *fam.args, *extra, "--data", data, "--out", out, "--steps", "0",
                "--seed", "11", "--quiet=true", "--tensorboard=false", "--val-every", "0",
                "--threads", oracle.THREADS])
    return os.path.join(out, "step_00000000")


def compare(case, fam, ckpt, grad_cmd, batch_loss, desc, p_cls=0.0):
    """grad_cmd: the `trellis grad` arguments; batch_loss(params, cfg) the reference loss."""
    gpath = os.path.join(oracle.TMP, f"{case}_grad.safetensors")
    stdout = oracle.run(["grad", "--checkpoint", ckpt, *grad_cmd, "--out", gpath,
                         "--threads", oracle.THREADS, *grad_args(p_cls)])
    t_loss = float(json.loads(stdout.strip().splitlines()[-1])["loss"])
    grads = load_safetensors(gpath)
    # without masks: must differ, or the comparison below could not see missing dropout
    plain, cfg = fam.load_model(ckpt, dtype=oracle.DTYPE)
    batch_loss(plain, cfg).backward()
    names = sorted(grads)
    d_plain = oracle.rel(np.concatenate([grads[n].ravel() for n in names]),
                         torch.cat([plain[n].grad.flatten() for n in names]).double().numpy())
    if not d_plain > 100 * oracle.TOL:
        fail(f"{case}: gradients without dropout differ from trellis's by only {d_plain:.1e}")
    params, cfg = fam.load_model(ckpt, dtype=oracle.DTYPE)
    drop.ACTIVE = drop.Dropout(SEED, STEP, P, P_ATTN, p_cls, first=0)
    try:
        loss = batch_loss(params, cfg)
    finally:
        drop.ACTIVE = None
    loss.backward()
    compare_grads(case, fam, params, cfg, loss.item(), t_loss, grads, gpath,
                  f"{desc}; without dropout the gradients differ by {d_plain:.1e}")


def lm_case(case, fam, byte_dir, T=32, B=4):
    ckpt = init(case, fam, byte_dir)
    shard = os.path.join(byte_dir, "train_000000.bin")
    x, y = windows(read_tokens(shard), T, range(B))
    compare(case, fam, ckpt, ["--data", shard, "--seq-len", T, "--batch-size", B],
            lambda params, cfg: fam.loss(params, cfg, x, y),
            f"dropout {P}, attn_dropout {P_ATTN}, {B}x{T} tokens")


def task_case(case, fam, task_dir, B=6, p_cls=0.0):
    ckpt = init(case, fam, task_dir)
    _, train, _ = torch_tasks.read_task(task_dir)

    def batch_loss(params, cfg):
        return fam.loss(params, cfg, torch_tasks.make_batch(cfg, train, range(B)))

    compare(case, fam, ckpt, ["--data", task_dir, "--batch-size", B], batch_loss,
            f"{B} examples, dropout {P}, attn_dropout {P_ATTN}, classifier_dropout {p_cls}",
            p_cls=p_cls)


def main():
    src = oracle.setup("torch_oracle_dropout", fresh=True)
    if src is None:
        return 2
    t0 = time.time()
    text, byte_dir = oracle.byte_corpus()
    cls_tsv = os.path.join(oracle.TMP, "texts.tsv")
    cls_dir = os.path.join(oracle.TMP, "classify")

    def classify():
        write_classify_tsv(cls_tsv)
        oracle.run(["prepare", "--task", "classify", "--input", cls_tsv, "--out", cls_dir,
                    "--val-fraction", 0.2])
        task_case("c (encoder classifier dropout grad)", ENC_MEAN, cls_dir, p_cls=P_CLS)

    def translate():
        mt_tsv, mt_dir = os.path.join(oracle.TMP, "pairs.tsv"), os.path.join(oracle.TMP, "mt")
        write_translate_tsv(mt_tsv)
        oracle.run(["prepare", "--task", "translate", "--input", mt_tsv, "--out", mt_dir,
                    "--val-fraction", 0.2])
        task_case("e (encdec translation dropout grad)", ENCDEC_MT, mt_dir)

    cases = [
        ("p", lambda: check_philox("p (philox)")),
        ("a", lambda: lm_case("a (gpt2 dropout grad)", GPT2, byte_dir)),
        ("b", lambda: lm_case("b (llama dropout grad)", LLAMA, byte_dir)),
        ("c", classify),
        ("d", lambda: lm_case("d (encdec dropout grad)", ENCDEC, byte_dir)),
        ("e", translate),
    ]
    return oracle.run_cases(cases, "torch oracle dropout", t0)


if __name__ == "__main__":
    sys.exit(main())
