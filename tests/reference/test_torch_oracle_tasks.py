#!/usr/bin/env python3
"""PyTorch oracle test of trellis's task models: classification and translation (run by ctest;
plain script).

Environment as test_torch_oracle.py: TRELLIS_BIN, TRELLIS_TMP, TRELLIS_SOURCE; PYTHONPATH must
contain <repo>/tests (added here too when TRELLIS_SOURCE is set). The comparisons are
test_torch_oracle.py's own (compare_grads, check_train, Family): every tensor compared
norm-wise, ||trellis - torch|| / ||torch|| <= 1e-5, against reference/torch_tasks.py (the
independent reference models with padding masks, pooling and task heads; the batches built from
the task directory's examples files as SequenceFormat documents them, not by trellis).

Data: `trellis prepare --task classify` of a TSV of short texts of 1-11 words in 3 classes, and
`--task translate` of word-for-word sentence pairs of 1-6 words; both padded to the longest
example, so every batch holds padding. An idx image directory written here gives feature inputs.

Checks (loss and every gradient of `trellis grad` on the first B training examples vs autograd):
  a. encoder-tiny classifier, mean pooling.
  b. encoder-tiny classifier, cls pooling, --seq-len 24 (some texts truncated, others padded).
  c. tiny GPT-2 classifier: last-token pooling (GPT2ForSequenceClassification), score.weight.
  d. llama-tiny classifier (4 heads over 2 kv heads), last-token pooling, score.weight.
  e. encdec-tiny translation: padded sources masked in encoder self-attention and in
     cross-attention, padded targets ignored.
  g. encoder-tiny --mlp none on idx images (2x3-pixel patches, features = pixel / 255,
     embed_features): as prepared (every image 4 patches: no padding), and with some images cut
     to fewer patches in train.examples (padding).
  h. the same model with --patch-context 1 on 6x9-pixel images (a 3x3 grid of 2x3 patches):
     each patch's input holds its 3x3 neighbourhood of patches, against the reference's
     conv2d of the whole image (kernel 6x9, stride 2x3, zero padding 2x3) with
     embed_features.weight as its kernel: a neighbour out of place, or missing, changes the
     loss and embed_features' gradient.
Training (10 AdamW steps of 8 examples, no shuffling, lr 1e-3 -> 1e-4 (warmup 2 + cosine),
weight decay 0.1, clipping at 1.0 that triggers; per-step loss and grad norm, final parameters
and AdamW moments; with test_torch_oracle.py's precondition that the reference in float32 and
float64 agree within COND_TOL, so that the comparison measures trellis and not rounding noise):
  f1. the encoder classifier (mean pooling), --seed 2 (F1_SEED, see below);
  f2. the GPT-2 classifier; f3. the encdec translation (both the default --seed 5).
The learning rate is the LM oracle's / 10 because of the precondition: at lr 1e-2 these task
models start ill-conditioned for most seeds (reference float32 vs float64 after 10 steps over
seeds 1-14: 3.8e-6 .. 2e-3 for f1, 3.1e-6 .. 5e-4 for f2, 7.5e-6 .. 8e-3 for f3; 2, 1 and 0 of
them within COND_TOL): at initialisation the small classifier head passes the body gradients
of ~1e-3 of the head's, many elements of them within rounding of AdamW's eps scale, whose
first updates (~lr each) rounding decides. At lr 1e-3 those updates are 10x smaller next to the
weights: of seeds 1-6, 5 pass for each model (f1 not seed 5: 8.9e-6; seed 2 has 1.8e-6, trellis
within 2.3e-6).

Each grad case (but g's first) asserts that its batch holds padding (some length < T) and that
the padding matters: the reference's gradient with every position counted as real (lengths = T:
no padding mask, pooling over all T) differs from the right one by more than 100 * 1e-5, so a
trellis that ignored the lengths would fail. Every grad case also pins the seq_len trellis
chose (the longest example; b: --seq-len 24; g: 4 patches; h: 9).

Exception (as in test_torch_oracle.py): key biases have an exactly zero gradient (a shift shared
by all keys of a softmax row, padding masks included), so they are checked to be zero up to
rounding on both sides (and, after AdamW steps, not to have moved) instead of compared.

A case that compares nothing fails, and so does a run in which no case ran.

Usage: test_torch_oracle_tasks.py [a b c d e f1 f2 f3 g h]  (default: all cases)
"""

import json
import os
import shutil
import sys
import time

if os.environ.get("TRELLIS_SOURCE"):
    sys.path.insert(0, os.path.join(os.environ["TRELLIS_SOURCE"], "tests"))

import torch  # noqa: E402

from reference import test_torch_oracle as oracle  # noqa: E402
from reference import torch_tasks  # noqa: E402
from reference.test_torch_oracle import Family, check_train, compare_grads, fail  # noqa: E402
from reference.test_torch_oracle_encdec import _encdec_zero_grad  # noqa: E402
from reference.torch_ref import load_safetensors  # noqa: E402
from trellis_test import write_classify_tsv, write_idx_dir, write_translate_tsv  # noqa: E402


def _encoder_zero_grad(name, cfg):
    return oracle._encoder_zero_grad(name, cfg.base)


def _gpt2_zero_grad(name, cfg):
    return oracle._gpt2_zero_grad(name, cfg.base)


def _task_encdec_zero_grad(name, cfg):
    return _encdec_zero_grad(name, cfg.base)


def task_family(name, args, zero_grad=lambda name, cfg: None):
    return Family(name, args, torch_tasks.load_model, torch_tasks.task_loss, zero_grad)


ENC_MEAN = task_family("encoder classifier", ["--model", "encoder-tiny"], _encoder_zero_grad)
ENC_CLS = task_family("encoder classifier", ["--model", "encoder-tiny", "--pooling", "cls"],
                      _encoder_zero_grad)
GPT2_CLS = task_family("gpt2 classifier", oracle.TINY, _gpt2_zero_grad)
LLAMA_CLS = task_family("llama classifier", ["--model", "llama-tiny", "--n-kv-head", "2"])
ENCDEC_MT = task_family("encdec translation", ["--model", "encdec-tiny"], _task_encdec_zero_grad)
ENC_IMG = task_family("encoder image classifier", ["--model", "encoder-tiny", "--mlp", "none"],
                      _encoder_zero_grad)
ENC_IMG_CONTEXT = task_family("encoder image classifier, patch context",
                              [*ENC_IMG.args, "--patch-context", 1], _encoder_zero_grad)

# ---------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------

def cut_patches(task_dir, out_dir, feature_dim):
    """A copy of task_dir whose train examples i % 3 == 1 keep 2 patches and i % 3 == 2 keep 3
    (of 4): variable-length image inputs. They are no longer whole images, so the copy's
    meta.json drops the image geometry (which would refuse them, and which only augmentation
    needs)."""
    shutil.copytree(task_dir, out_dir)
    with open(os.path.join(out_dir, "meta.json")) as f:
        meta_json = json.load(f)
    meta_json.pop("image", None)
    with open(os.path.join(out_dir, "meta.json"), "w") as f:
        json.dump(meta_json, f)
    meta, train, _ = torch_tasks.read_task(task_dir)
    cut = []
    for i, (label, source, target) in enumerate(train):
        keep = {0: len(source) // feature_dim, 1: 2, 2: 3}[i % 3]
        cut.append((label, source[:keep * feature_dim], target))
    torch_tasks.write_examples(os.path.join(out_dir, "train.examples"), cut)


# ---------------------------------------------------------------------------
# checks
# ---------------------------------------------------------------------------


def natural_T(task_dir):
    """The positions the longest example needs (trellis's default seq_len for a task)."""
    meta, train, val = torch_tasks.read_task(task_dir)
    return max(torch_tasks.needed(meta, s, t) for _, s, t in train + val)


def check_padding(case, fam, cfg, batch, params):
    """The batch holds padding, and it matters: counting every position as real (lengths = T:
    no padding mask, pooling over all T) changes the reference's gradient (all parameters as one
    vector) by more than 100 * TOL. Call after loss.backward() (params hold the gradients)."""
    lengths = batch["lengths"]
    if int((lengths < cfg.T).sum()) == 0:
        fail(f"{case}: no example of the batch is padded (lengths {lengths.tolist()}, T {cfg.T})")
    other = {n: p.detach().clone().requires_grad_(True) for n, p in params.items()}
    full = dict(batch, lengths=torch.full_like(lengths, cfg.T))
    fam.loss(other, cfg, full).backward()
    names = sorted(params)
    d = oracle.rel(torch.cat([other[n].grad.flatten() for n in names]).double().numpy(),
                   torch.cat([params[n].grad.flatten() for n in names]).double().numpy())
    if not d > 100 * oracle.TOL:
        fail(f"{case}: counting the padding as real changes the reference gradient by only "
             f"{d:.1e}; the comparison would not see a trellis that ignores the lengths")
    return f"lengths {lengths.tolist()} of T {cfg.T} (as if unpadded: gradient differs by {d:.1e})"


def check_task_grad(case, fam, task_dir, B, seed=11, seq_len=0, want_T=None, padded=True):
    """Loss and every gradient of `trellis grad` on the first B training examples; padded:
    the batch must hold padding (else it must hold none)."""
    out = os.path.join(oracle.TMP, f"{case}_init")
    oracle.run(["train", *fam.args, "--data", task_dir, "--out", out, "--steps", "0",
                "--seed", seed, "--seq-len", seq_len, "--quiet=true", "--tensorboard=false",
                "--val-every", "0", "--threads", oracle.THREADS])
    ckpt = os.path.join(out, "step_00000000")
    gpath = os.path.join(oracle.TMP, f"{case}_grad.safetensors")
    stdout = oracle.run(["grad", "--checkpoint", ckpt, "--data", task_dir, "--batch-size", B,
                         "--out", gpath, "--threads", oracle.THREADS])
    t_loss = float(json.loads(stdout.strip().splitlines()[-1])["loss"])
    grads = load_safetensors(gpath)

    params, cfg = fam.load_model(ckpt, dtype=oracle.DTYPE)
    want_T = want_T or natural_T(task_dir)
    if cfg.T != want_T:
        fail(f"{case}: the checkpoint's seq_len is {cfg.T}, expected {want_T}")
    meta, train, _ = torch_tasks.read_task(task_dir)
    batch = torch_tasks.make_batch(cfg, train, range(B), meta)
    loss = fam.loss(params, cfg, batch)
    loss.backward()
    if padded:
        pad_note = check_padding(case, fam, cfg, batch, params)
    else:
        pad_note = f"every length T {cfg.T}"
        if not bool((batch["lengths"] == cfg.T).all()):
            fail(f"{case}: lengths {batch['lengths'].tolist()}, expected all {cfg.T}")
    what = (f"{cfg.num_classes} classes, {cfg.pooling} pooling" if cfg.task == "classify"
            else f"{int((batch['targets'] >= 0).sum())} target tokens")
    compare_grads(case, fam, params, cfg, loss.item(), t_loss, grads, gpath,
                  f"{B} examples, {what}, {pad_note}")


class TaskBatches:
    """batches(s) for check_train: examples [s*G, s*G + G) mod n of the train split (trellis
    with --shuffle false), built by the reference from the init checkpoint's config; counts
    the padded rows it hands out."""

    def __init__(self, case, task_dir, G):
        self.init = os.path.join(oracle.TMP, f"{case}_init", "step_00000000")
        _, self.train, _ = torch_tasks.read_task(task_dir)
        self.G, self.cfg, self.padded, self.rows = G, None, 0, 0

    def __call__(self, s):
        if self.cfg is None:  # check_train wrote the init checkpoint before the first step
            self.cfg = torch_tasks.TaskConfig.from_json(os.path.join(self.init, "config.json"))
        n = len(self.train)
        batch = torch_tasks.make_batch(self.cfg, self.train,
                                       [(s * self.G + j) % n for j in range(self.G)])
        self.padded += int((batch["lengths"] < self.cfg.T).sum())
        self.rows += self.G
        return batch, None


F1_SEED = 2  # case f1's --seed, chosen by the precondition (see above)


def check_task_train(case, fam, task_dir, G=8, steps=10, lr=1e-3, min_lr=1e-4, **kw):
    """check_train (kw: its seed, eps, clip, ...) on the task's batches."""
    T = natural_T(task_dir)
    batches = TaskBatches(case, task_dir, G)
    n_fail = len(oracle.failures)
    check_train(case, fam, task_dir, steps, G, T, lr=lr, min_lr=min_lr, batches=batches, **kw)
    if batches.rows == 0 or batches.padded == 0:
        fail(f"{case}: the {batches.rows} training rows compared hold no padding")
    elif len(oracle.failures) == n_fail:
        print(f"  ({case}: {batches.padded} of {batches.rows} training rows padded to T {T})",
              flush=True)


def main():
    src = oracle.setup("torch_oracle_tasks", fresh=True)
    if src is None:
        return 2
    t0 = time.time()

    inputs = os.path.join(oracle.TMP, "inputs")
    os.makedirs(inputs)
    cls_tsv, mt_tsv = os.path.join(inputs, "texts.tsv"), os.path.join(inputs, "pairs.tsv")
    write_classify_tsv(cls_tsv)
    write_translate_tsv(mt_tsv)
    write_idx_dir(os.path.join(inputs, "idx"))
    write_idx_dir(os.path.join(inputs, "idx9"), rows=6, cols=9)
    cls_dir = os.path.join(oracle.TMP, "classify")
    mt_dir = os.path.join(oracle.TMP, "translate")
    img_dir = os.path.join(oracle.TMP, "images")
    img_cut = os.path.join(oracle.TMP, "images_cut")
    img9_dir = os.path.join(oracle.TMP, "images9")
    oracle.run(["prepare", "--task", "classify", "--input", cls_tsv, "--out", cls_dir,
                "--val-fraction", 0.2])
    oracle.run(["prepare", "--task", "translate", "--input", mt_tsv, "--out", mt_dir,
                "--val-fraction", 0.2])
    oracle.run(["prepare", "--task", "classify", "--input", os.path.join(inputs, "idx"),
                "--patch", "2x3", "--out", img_dir])
    cut_patches(img_dir, img_cut, 6)
    oracle.run(["prepare", "--task", "classify", "--input", os.path.join(inputs, "idx9"),
                "--patch", "2x3", "--out", img9_dir])

    def truncation_case():
        # T 24: texts of more than 22 bytes are cut, shorter ones padded; both in the batch
        _, train, _ = torch_tasks.read_task(cls_dir)
        n = [len(s) for _, s, _ in train[:8]]
        if not (max(n) > 22 and min(n) < 22):
            fail(f"b: the first 8 texts ({n} bytes) are not both longer and shorter than 22")
        check_task_grad("b (encoder cls pooling, truncated)", ENC_CLS, cls_dir, 8, seq_len=24,
                        want_T=24)

    cases = [
        ("a", lambda: check_task_grad("a (encoder mean pooling)", ENC_MEAN, cls_dir, 8)),
        ("b", truncation_case),
        ("c", lambda: check_task_grad("c (gpt2 last-token)", GPT2_CLS, cls_dir, 8)),
        ("d", lambda: check_task_grad("d (llama gqa last-token)", LLAMA_CLS, cls_dir, 8)),
        ("e", lambda: check_task_grad("e (encdec translation)", ENCDEC_MT, mt_dir, 8)),
        ("f1", lambda: check_task_train("f1 (encoder classifier adamw)", ENC_MEAN, cls_dir,
                                        seed=F1_SEED)),
        ("f2", lambda: check_task_train("f2 (gpt2 classifier adamw)", GPT2_CLS, cls_dir)),
        ("f3", lambda: check_task_train("f3 (encdec translation adamw)", ENCDEC_MT, mt_dir)),
        ("g", lambda: (check_task_grad("g (image features, 4 patches each)", ENC_IMG, img_dir, 6,
                                       want_T=4, padded=False),
                       check_task_grad("g (image features, 2-4 patches)", ENC_IMG, img_cut, 6,
                                       want_T=4))),
        ("h", lambda: check_task_grad("h (image features, patch context 1)", ENC_IMG_CONTEXT,
                                      img9_dir, 6, want_T=9, padded=False)),
    ]
    return oracle.run_cases(cases, "torch oracle tasks", t0)


if __name__ == "__main__":
    sys.exit(main())
