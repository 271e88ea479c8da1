"""Dropout keeps invariant 3 (DESIGN invariant 6): with dropout 0.1 and attn_dropout 0.1 every
layout trains the 1-process run's model, per-step losses over 20 steps, validation losses (which
draw no masks) and final parameters within 1e-5 relative (fp32), because each mask is a function
of (seed, step, global sequence, layer, site, position, element) and never of the rank:
  - the encoder-decoder on translation pairs (embedding and decoder-embedding dropout, self and
    cross attention over padded sources, 4 query heads over 2 kv heads): dp2, tp2 + sequence
    parallelism (head and row offsets), pp2 1F1B (a chunk holds global layers 2-3), and
    dp2 x tp2 x pp2 with ZeRO-1;
  - the encoder classifier (classifier_dropout 0.1 too): dp2 and tp2;
  - dp2 with ZeRO-3 and full recompute is bitwise the dp2 ZeRO-3 run without recompute (losses
    and checkpoint bytes): recompute redraws exactly the first pass's masks.
A test that can fail: TRELLIS_TEST_DROPOUT_PLANT=1 makes each rank mix its rank into the dropout
seed (a layout-dependent mask); the same comparison must then reject dp2 and tp2 + SP.
Micro-batches of 2 everywhere (accumulation over 4 or 2 of them), as test_model_layouts."""
import os

from trellis_test import (LayoutCheck, check, compare_params, fresh_dir, metrics, mpirun,
                          prepare_task_dirs)

cls_dir, mt_dir = prepare_task_dirs()
STEPS = 20
common = ["--steps", STEPS, "--batch-size", 8, "--micro-batch-size", 2, "--lr", 3e-3,
          "--warmup-steps", 4, "--val-every", 10, "--val-batches", 1, "--threads", 1, "--quiet",
          "--tensorboard", "false", "--shuffle", "false", "--dropout", 0.1, "--attn-dropout", 0.1]
# seq_len 34 (the pairs need 33): sequence parallelism splits B x T rows over tp = 2
encdec = ["train", "--model", "encdec-tiny", "--n-head", 4, "--n-kv-head", 2, "--data", mt_dir,
          "--seq-len", 34] + common
classifier = ["train", "--model", "encoder-tiny", "--data", cls_dir,
              "--classifier-dropout", 0.1] + common

mt = LayoutCheck(encdec, n_embd=32, steps=STEPS, name="encdec_baseline")
for name, ranks, extra in [
        ("dp2", 2, ["--dp", 2]),
        ("tp2_sp", 2, ["--tp", 2, "--sequence-parallel"]),
        ("pp2_1f1b", 2, ["--pp", 2, "--schedule", "1f1b"]),
        ("dp2_tp2_pp2_zero1", 8, ["--dp", 2, "--tp", 2, "--pp", 2, "--zero", 1,
                                  "--sequence-parallel"])]:
    mt.check(f"encdec_{name}", ranks, extra)

cls = LayoutCheck(classifier, n_embd=32, steps=STEPS, name="classifier_baseline")
cls.check("classifier_dp2", 2, ["--dp", 2])
cls.check("classifier_tp2", 2, ["--tp", 2])


def tensor_bytes(out):
    step = os.path.join(out, f"step_{STEPS:08d}")
    files = sorted(n for n in os.listdir(step) if n.endswith(".safetensors"))
    check(files, f"{out}: the checkpoint holds tensor files")
    return [open(os.path.join(step, n), "rb").read() for n in files]


runs = {}
for mode in ("none", "full"):
    out = fresh_dir(f"encdec_dp2_zero3_{mode}")
    mpirun(2, encdec + ["--dp", 2, "--zero", 3, "--recompute", mode, "--out", out])
    train, val = metrics(out)
    runs[mode] = ([r["loss"] for r in train], [v["val_loss"] for v in val], tensor_bytes(out))
check(runs["full"][:2] == runs["none"][:2],
      f"dp2 ZeRO-3: full recompute's losses bitwise equal to none's ({runs['none'][0][-1]!r})")
check(runs["full"][2] == runs["none"][2],
      "dp2 ZeRO-3: full recompute's checkpoint tensors byte-equal to none's")
base_loss = mt.base[0]
worst = max(abs(a - b) / abs(b) for a, b in zip(runs["none"][0], base_loss))
check(worst <= 1e-5, f"dp2 ZeRO-3: losses match the 1-process run (worst {worst:.1e})")


# The planted layout-dependent mask: the comparison LayoutCheck makes must fail.
def planted(name, extra):
    out = fresh_dir(f"planted_{name}")
    launcher = ["mpirun", "--oversubscribe", "--mca", "mpi_yield_when_idle", "1", "-np", "2",
                "-x", "TRELLIS_TEST_DROPOUT_PLANT=1"]
    mpirun(2, encdec + [str(a) for a in extra] + ["--out", out], launcher=launcher)
    loss, val, params = mt._result(out)
    worst_loss = max(abs(a - b) / abs(b) for a, b in zip(loss, mt.base[0]))
    worst_p, where, whole = compare_params(params, mt.base[2], 32)
    # LayoutCheck accepts at <= 1e-5 (mt.tol); the planted mask must be well outside it
    check(worst_loss > 10 * mt.tol and whole > 10 * mt.tol,
          f"planted rank-dependent mask under {name}: rejected (losses differ by up to "
          f"{worst_loss:.1e}, parameters by {whole:.1e})")


planted("dp2", ["--dp", 2])
planted("tp2_sp", ["--tp", 2, "--sequence-parallel"])
print("dropout layouts: all checks passed")
