"""Activation recomputation changes memory, never results: --recompute selective and full give
bitwise the same run as none in the same layout (per-step train losses, validation losses and
the final parameters' bytes), for GPT-2, LLaMA, the encoder classifier and the encoder-decoder,
as one process and under tp2 with sequence parallelism (the classifier: tp2 without it, which it
refuses), pp2 (1f1b) and dp2. Under tensor parallelism full recompute runs the block's forward
collectives again in its backward, the same on every rank; a mismatch in their order would hang
or differ here. The metrics' activation_bytes shrink from none to selective to full."""
import os

from trellis_test import (TMP, check, fresh_dir, metrics, mpirun, prepare_task_dirs, run,
                          write_text_corpus)

corpus = fresh_dir("corpus")
write_text_corpus(os.path.join(corpus, "text.txt"), n_lines=400)
lm_data = os.path.join(TMP, "data")
run(["prepare", "--input", corpus, "--out", lm_data])
cls_dir, mt_dir = prepare_task_dirs()

STEPS = 6
common = ["--steps", STEPS, "--batch-size", 8, "--micro-batch-size", 2, "--lr", 3e-3,
          "--warmup-steps", 2, "--val-every", 3, "--val-batches", 1, "--threads", 1, "--quiet",
          "--tensorboard", "false"]
models = {
    "gpt2": ["train", "--model", "tiny", "--n-layer", 2, "--n-head", 2, "--data", lm_data,
             "--seq-len", 32],
    "llama": ["train", "--model", "llama-tiny", "--n-layer", 2, "--n-head", 4, "--n-kv-head", 2,
              "--data", lm_data, "--seq-len", 32],
    "encoder_cls": ["train", "--model", "encoder-tiny", "--data", cls_dir, "--shuffle", "false"],
    # seq_len 34 (the pairs need 33): sequence parallelism splits B x T rows over tp = 2
    "encdec": ["train", "--model", "encdec-tiny", "--n-head", 4, "--n-kv-head", 2, "--data",
               mt_dir, "--seq-len", 34, "--shuffle", "false"],
}
layouts = {
    "1proc": (1, []),
    "tp2_sp": (2, ["--tp", 2, "--sequence-parallel"]),
    "pp2_1f1b": (2, ["--pp", 2, "--schedule", "1f1b"]),
    "dp2": (2, ["--dp", 2]),
}


def result(out):
    train, val = metrics(out)
    # The checkpoint's tensor files (parameters, optimizer moments), whatever their sharding.
    step = os.path.join(out, f"step_{STEPS:08d}")
    params = []
    for name in sorted(os.listdir(step)):
        if name.endswith(".safetensors"):
            with open(os.path.join(step, name), "rb") as f:
                params.append((name, f.read()))
    check(params, f"{out}: the checkpoint holds tensor files")
    return ([r["loss"] for r in train], [v["val_loss"] for v in val], params,
            [r["activation_bytes"] for r in train])


for model, args in models.items():
    for layout, (ranks, extra) in layouts.items():
        if model == "encoder_cls" and layout == "tp2_sp":
            extra = ["--tp", 2]
        runs = {}
        for mode in ("none", "selective", "full"):
            out = fresh_dir(f"{model}_{layout}_{mode}")
            cmd = args + common + extra + ["--recompute", mode, "--out", out]
            if ranks == 1:
                run(cmd)
            else:
                mpirun(ranks, cmd)
            runs[mode] = result(out)
        loss, val, params, act = runs["none"]
        check(len(loss) == STEPS and len(val) == 2, f"{model} {layout}: {STEPS} steps, 2 validations")
        for mode in ("selective", "full"):
            l2, v2, p2, _ = runs[mode]
            check(l2 == loss and v2 == val,
                  f"{model} {layout} {mode}: losses bitwise equal to none ({loss[-1]!r})")
            check(p2 == params,
                  f"{model} {layout} {mode}: checkpoint tensors (parameters, moments) byte-equal "
                  "to none")
        sizes = [runs[m][3][-1] for m in ("none", "selective", "full")]
        check(sizes[0] > sizes[1] > sizes[2] > 0,
              f"{model} {layout}: activation_bytes none {sizes[0]} > selective {sizes[1]} > "
              f"full {sizes[2]}")
