#!/usr/bin/env python3
"""PyTorch oracle test of label smoothing (run by ctest; plain script).

Environment as test_torch_oracle.py: TRELLIS_BIN, TRELLIS_TMP, TRELLIS_SOURCE; PYTHONPATH must
contain <repo>/tests (added here too when TRELLIS_SOURCE is set). The comparisons are
test_torch_oracle.py's own (compare_grads, check_train): every tensor compared norm-wise,
||trellis - torch|| / ||torch|| <= 1e-5. The references are the oracle's models; their loss is
torch.nn.functional.cross_entropy(..., label_smoothing=E) itself (PyTorch's definition: the
target keeps 1 - E, E is spread evenly over the V classes of the logits, which are the true
vocabulary; ignored targets stay out of the mean), never a formula re-derived from trellis.

Checks (loss and every gradient of `trellis grad --label-smoothing E`, E = 0.1):
  a. tiny GPT-2, byte tokenizer, --vocab-multiple 96: 256 tokens padded to 288 rows, so 32
     padded vocabulary rows must stay out of the softmax and of the smoothing's mean.
  b. tiny GPT-2, GPT-2 BPE (50257 tokens padded to 50304).
  c. llama-tiny (4 heads over 2 kv heads, untied head), byte tokenizer.
  d. encoder-tiny classifier (mean pooling) on padded texts, 3 classes.
  e. encdec-tiny translation: padded targets (-1) out of the loss and of the mean; a vocabulary
     of 257 (bytes and the special token) padded to 320.
  f. training: tiny GPT-2 (--vocab-multiple 96) trained 10 AdamW steps with
     `train --label-smoothing E` against the reference trained on the smoothed loss (per-step
     loss and grad norm, final parameters, AdamW moments). With check_train's precondition
     (the reference in float32 and float64 within TOL/2): --seed 2 (F_SEED). Of seeds 1-7, the
     default 5 and 1, 3, 6, 7 are ill-conditioned (float32 vs float64 of the reference 8e-6 ..
     7e-5 after 10 steps, from c_fc elements whose step-1 AdamW updates rounding decides); 2 and
     4 pass, 2 with trellis within 1.7e-6.
  The grad cases compare with the float32 reference (TRELLIS_ORACLE_DTYPE as the oracle's),
  except b, whose float32 reference is itself off by ~2e-5 (the smoothed loss over 50257
  classes in float32; trellis evaluates the loss in double and is within 5e-7 of the float64
  reference), so b always uses the float64 one.
  g. as a, with dropout 0.2 and attn_dropout 0.3 on as well (test_torch_oracle_dropout.py's
     grad arguments; the reference draws the masks itself with reference/dropout_masks.py).
Each grad case also asserts that the smoothing matters: the reference's unsmoothed gradients
differ from the smoothed ones by more than 100 * 1e-5 and its loss by more than 3 * 1e-5 (at
initialisation the logits are nearly uniform, so -log p_target is close to its mean over the
classes and the losses differ by only ~1e-4; the gradients by ~0.1), so a trellis that ignored
the key would fail. Smoothing over the padded rows too fails a, b and e (checked by mutating
the kernel: gradients off by 1e-3 .. 2e-2).

Usage: test_torch_oracle_smoothing.py [a b c d e f g]  (default: all cases)
"""

import json
import os
import sys
import time

if os.environ.get("TRELLIS_SOURCE"):
    sys.path.insert(0, os.path.join(os.environ["TRELLIS_SOURCE"], "tests"))

import torch  # noqa: E402

from reference import dropout_masks as drop  # noqa: E402
from reference import test_torch_oracle as oracle  # noqa: E402
from reference import test_torch_oracle_dropout as dropout_oracle  # noqa: E402
from reference import test_torch_oracle_tasks as tasks  # noqa: E402
from reference import torch_gpt, torch_llama, torch_tasks  # noqa: E402
from reference.test_torch_oracle import Family, compare_grads, fail  # noqa: E402
from reference.torch_ref import load_safetensors, read_tokens, windows  # noqa: E402
from trellis_test import write_classify_tsv, write_translate_tsv  # noqa: E402

E = 0.1
F_SEED = 2  # case f's --seed, chosen by check_train's precondition (see the module comment)


def smoothed(fam, e=E):
    """fam trained and differentiated with label smoothing e: `train --label-smoothing e`, and
    the reference's loss with F.cross_entropy(label_smoothing=e)."""
    def loss(params, cfg, x, y, label_smoothing=e):
        return fam.loss(params, cfg, x, y, label_smoothing=label_smoothing)
    return Family(fam.name + f" smoothed {e}", [*fam.args, "--label-smoothing", e],
                  fam.load_model, loss, fam.zero_grad)


def smoothing_matters(case, params, loss_of):
    """The unsmoothed reference (loss and all gradients) differs from the smoothed one (params
    hold its gradients) by more than 100 * TOL; loss_of(params, label_smoothing) -> loss."""
    other = {n: p.detach().clone().requires_grad_(True) for n, p in params.items()}
    plain = loss_of(other, 0.0)
    plain.backward()
    names = sorted(params)
    d = oracle.rel(torch.cat([other[n].grad.flatten() for n in names]).double().numpy(),
                   torch.cat([params[n].grad.flatten() for n in names]).double().numpy())
    smooth_loss = loss_of({n: p.detach() for n, p in params.items()}, E).item()
    dl = abs(plain.item() - smooth_loss) / abs(smooth_loss)
    if not (d > 100 * oracle.TOL and dl > 3 * oracle.TOL):
        fail(f"{case}: without smoothing the reference changes by only {dl:.1e} (loss), "
             f"{d:.1e} (gradients); the comparison would not see a trellis that ignores it")
    return f"unsmoothed differs by {dl:.1e} (loss), {d:.1e} (gradients)"


def check_lm_grad(case, fam, datadir, T=32, B=4, dtype=oracle.DTYPE, dropout=False):
    """check_grad of test_torch_oracle.py with `grad --label-smoothing E`; dtype: the
    reference's; dropout: also test_torch_oracle_dropout.py's dropout (its grad arguments, and
    its masks drawn by reference/dropout_masks.py in the reference)."""
    fam = smoothed(fam)
    out = os.path.join(oracle.TMP, f"{case}_init")
    oracle.run(["train", *fam.args, "--data", datadir, "--out", out, "--steps", "0",
                "--seed", "11", "--quiet=true", "--tensorboard=false", "--val-every", "0",
                "--threads", oracle.THREADS])
    ckpt = os.path.join(out, "step_00000000")
    shard = os.path.join(datadir, "train_000000.bin")
    gpath = os.path.join(oracle.TMP, f"{case}_grad.safetensors")
    stdout = oracle.run(["grad", "--checkpoint", ckpt, "--data", shard, "--seq-len", T,
                         "--batch-size", B, "--out", gpath, "--threads", oracle.THREADS,
                         "--label-smoothing", E, *(dropout_oracle.grad_args() if dropout else [])])
    t_loss = float(json.loads(stdout.strip().splitlines()[-1])["loss"])
    grads = load_safetensors(gpath)
    params, cfg = fam.load_model(ckpt, dtype=dtype)
    x, y = windows(read_tokens(shard), T, range(B))
    if dropout:
        D = dropout_oracle
        drop.ACTIVE = drop.Dropout(D.SEED, D.STEP, D.P, D.P_ATTN, 0.0, first=0)
    try:
        loss = fam.loss(params, cfg, x, y)
        loss.backward()
        note = smoothing_matters(case, params,
                                 lambda p, e: fam.loss(p, cfg, x, y, label_smoothing=e))
    finally:
        drop.ACTIVE = None
    compare_grads(case, fam, params, cfg, loss.item(), t_loss, grads, gpath,
                  f"vocab {cfg.vocab_size}, {B}x{T} tokens, label smoothing {E}, "
                  f"{str(dtype).replace('torch.', '')} reference, {note}")


def check_task_grad(case, fam, task_dir, B=8):
    """test_torch_oracle_tasks.py's check_task_grad with `grad --label-smoothing E`."""
    fam = smoothed(fam)
    out = os.path.join(oracle.TMP, f"{case}_init")
    oracle.run(["train", *fam.args, "--data", task_dir, "--out", out, "--steps", "0",
                "--seed", 11, "--quiet=true", "--tensorboard=false", "--val-every", "0",
                "--threads", oracle.THREADS])
    ckpt = os.path.join(out, "step_00000000")
    gpath = os.path.join(oracle.TMP, f"{case}_grad.safetensors")
    stdout = oracle.run(["grad", "--checkpoint", ckpt, "--data", task_dir, "--batch-size", B,
                         "--out", gpath, "--threads", oracle.THREADS, "--label-smoothing", E])
    t_loss = float(json.loads(stdout.strip().splitlines()[-1])["loss"])
    grads = load_safetensors(gpath)
    params, cfg = fam.load_model(ckpt, dtype=oracle.DTYPE)
    _, train, _ = torch_tasks.read_task(task_dir)
    batch = torch_tasks.make_batch(cfg, train, range(B))
    loss = fam.loss(params, cfg, batch, None)
    loss.backward()
    note = smoothing_matters(case, params,
                             lambda p, e: fam.loss(p, cfg, batch, None, label_smoothing=e))
    if cfg.task == "classify":
        what = f"{cfg.num_classes} classes"
    else:
        t = batch["targets"]
        what = f"{int((t >= 0).sum())} target tokens of {t.numel()}, vocab {cfg.base.vocab_size}"
        if int((t < 0).sum()) == 0:
            fail(f"{case}: the batch has no padded target")
    compare_grads(case, fam, params, cfg, loss.item(), t_loss, grads, gpath,
                  f"{B} examples, {what}, label smoothing {E}, {note}")


def main():
    src = oracle.setup("torch_oracle_smoothing", fresh=True)
    if src is None:
        return 2
    t0 = time.time()

    text, byte_dir = oracle.byte_corpus()
    bpe_dir = os.path.join(oracle.TMP, "data_gpt2")
    inputs = os.path.join(oracle.TMP, "inputs")
    os.makedirs(inputs)
    cls_tsv, mt_tsv = os.path.join(inputs, "texts.tsv"), os.path.join(inputs, "pairs.tsv")
    write_classify_tsv(cls_tsv)
    write_translate_tsv(mt_tsv)
    cls_dir = os.path.join(oracle.TMP, "classify")
    mt_dir = os.path.join(oracle.TMP, "translate")
    oracle.run(["prepare", "--task", "classify", "--input", cls_tsv, "--out", cls_dir,
                "--val-fraction", 0.2])
    oracle.run(["prepare", "--task", "translate", "--input", mt_tsv, "--out", mt_dir,
                "--val-fraction", 0.2])

    # 256 byte tokens in rows padded to a multiple of 96: 288, 32 of them padding
    gpt2_padded = Family("gpt2", [*oracle.TINY, "--vocab-multiple", 96], torch_gpt.load_model,
                         torch_gpt.gpt_loss, oracle._gpt2_zero_grad)
    llama = Family("llama", ["--model", "llama-tiny", "--n-kv-head", 2], torch_llama.load_model,
                   torch_llama.llama_loss)

    def bpe_case():
        oracle.run(["prepare", "--input", text, "--out", bpe_dir, "--tokenizer", "gpt2",
                    "--tokenizer-dir", os.path.join(src, "tests", "data", "gpt2")])
        # float64 reference: PyTorch's float32 smoothed loss over 50257 classes carries ~2e-5
        # of rounding in ln_f.weight's gradient (trellis, whose loss is evaluated in double, is
        # within 5e-7 of the float64 one)
        check_lm_grad("b (gpt2 bpe, 50257 of 50304 rows)", oracle.GPT2, bpe_dir,
                      dtype=torch.float64)

    cases = [
        ("a", lambda: check_lm_grad("a (gpt2 byte, 256 of 288 rows)", gpt2_padded, byte_dir)),
        ("b", bpe_case),
        ("c", lambda: check_lm_grad("c (llama gqa byte)", llama, byte_dir)),
        ("d", lambda: check_task_grad("d (encoder classifier)", tasks.ENC_MEAN, cls_dir)),
        ("e", lambda: check_task_grad("e (encdec translation)", tasks.ENCDEC_MT, mt_dir)),
        ("f", lambda: oracle.check_train("f (gpt2 adamw, smoothed)", smoothed(gpt2_padded),
                                         byte_dir, 10, 4, 32, seed=F_SEED)),
        ("g", lambda: check_lm_grad("g (gpt2 byte, 256 of 288 rows, with dropout)", gpt2_padded,
                                    byte_dir, dropout=True)),
    ]
    return oracle.run_cases(cases, "torch oracle label smoothing", t0)


if __name__ == "__main__":
    sys.exit(main())
