"""Resume of task runs: a classification run (encoder-tiny, padded texts) and a translation run
(encdec-tiny, padded pairs), each 20 steps in one go == 10 steps, --stop-at, --resume for 10 more:
bitwise equal per-step losses and learning rates, validation metrics, final parameters and
optimizer state. The runs shuffle (default), 6 steps per epoch, so the resumed run must
also continue the data order inside an epoch and across the next ones."""
import os

from trellis_test import check, checkpoint_bytes, fresh_dir, metrics, prepare_task_dirs, run

cls_dir, mt_dir = prepare_task_dirs()

common = ["--batch-size", 8, "--micro-batch-size", 4, "--lr", 3e-3, "--warmup-steps", 3,
          "--val-every", 5, "--threads", 1, "--quiet", "--tensorboard", "false"]
runs = {
    "classify": ["--model", "encoder-tiny", "--data", cls_dir] + common,
    "translate": ["--model", "encdec-tiny", "--data", mt_dir] + common,
}


def read(path):
    with open(path, "rb") as f:
        return f.read()


for name, args in runs.items():
    full = fresh_dir(f"{name}_full")
    run(["train", "--out", full, "--steps", 20] + args)
    split = fresh_dir(f"{name}_split")
    run(["train", "--out", split, "--steps", 20, "--stop-at", 10] + args)
    check(os.path.isdir(os.path.join(split, "step_00000010")) and
          not os.path.isdir(os.path.join(split, "step_00000020")),
          f"{name}: stopped at step 10 with a checkpoint")
    run(["train", "--out", split, "--steps", 20, "--resume"] + args)

    a, va = metrics(full)
    b, vb = metrics(split)
    check([r["step"] for r in b] == list(range(1, 21)), f"{name}: steps 1..20 logged once each")
    check([r["loss"] for r in a] == [r["loss"] for r in b],
          f"{name}: losses bitwise equal over 20 steps")
    check(len(set(r["loss"] for r in a)) == 20, f"{name}: the losses change from step to step")
    check([r["lr"] for r in a] == [r["lr"] for r in b], f"{name}: learning rates equal")
    check(len(va) == 4 and va == vb,
          f"{name}: validation metrics at steps 5, 10, 15, 20 equal ({sorted(va[0])})")
    for f in ("params", "optimizer"):
        check(checkpoint_bytes(os.path.join(full, "step_00000020"), f) ==
              checkpoint_bytes(os.path.join(split, "step_00000020"), f),
              f"{name}: final {f} bitwise equal")
    if name == "classify":
        check(read(os.path.join(full, "confusion.json")) ==
              read(os.path.join(split, "confusion.json")), f"{name}: confusion.json equal")
